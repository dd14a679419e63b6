"""Whether a client's scheduler runs the plugin, is idle or has none
(:func:`plugin_status`): asked once per client and scheduler address, in the
background, off the submissions' path; one WARNING naming the fix when it has none
(or pointing at distributed's "Failed to start preload" line, for a scheduler whose
preload failed), one pointing at the scheduler's ERROR line when it is idle."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Literal

from dask_otel_spans import names

if TYPE_CHECKING:
    from distributed import Client

logger = logging.getLogger(__name__)

#: How to give a scheduler the plugin (in the WARNING, and in
#: :class:`~dask_otel_spans.client.state.PluginMissing`)
PLUGIN_FIX = (
    "start it with `dask scheduler --preload dask_otel_spans`, set "
    "distributed.scheduler.preload: [dask_otel_spans] in the scheduler's dask config "
    "(DASK_DISTRIBUTED__SCHEDULER__PRELOAD='[\"dask_otel_spans\"]'), or call "
    "client.register_plugin(OTelSpansPlugin())"
)

#: What a scheduler has of the plugin: one that exports, one loaded but idle (its
#: configuration cannot work), none
PluginStatus = Literal["running", "idle", "absent"]

#: (client id, scheduler address) of the clients whose scheduler was asked whether
#: it runs the plugin
_PLUGIN_CHECKED: set[tuple[str, str]] = set()

def check_plugin_soon(client: Client) -> None:
    """Once per client and scheduler address, ask that scheduler in the background
    whether it runs the plugin (the metadata a plugin sets); when it has none, one
    WARNING naming the fix, when its plugin is idle, one WARNING pointing at the
    scheduler's ERROR line. Adds no wait to the caller and never raises."""
    try:
        assert client.scheduler is not None, "the client is closed"
        key = (str(client.id), str(client.scheduler.address))
        if key in _PLUGIN_CHECKED:
            return
        _PLUGIN_CHECKED.add(key)
        loop = client.loop
        assert loop is not None, "the client has no loop"
        loop.add_callback(_check_plugin, client, key[1])
    except Exception as e:  # (a closed client, a client without a loop)
        logger.debug("dask_otel_spans: cannot check the scheduler for the plugin: %s", e)


async def plugin_metadata(client: Client) -> dict[str, object]:
    """The scheduler metadata the plugin sets (below ``"dask_otel_spans"``), asked
    for in one message by the asynchronous ``client`` (or a client whose loop this
    runs on), no code run on the scheduler; empty when none is set."""
    scheduler = client.scheduler
    if scheduler is None:  # (a closed client: as reading the attribute of None did)
        raise AttributeError("the client is closed: it has no scheduler")
    said = await scheduler.get_metadata(keys=[names.PLUGIN_METADATA_KEYS[0]],
                                        default=None)
    return dict(said) if isinstance(said, dict) else {}


def status_of(metadata: dict[str, object]) -> PluginStatus:
    """What :func:`plugin_metadata` says of the plugin (a plugin of a version that
    does not say whether it is idle: running)."""
    if not metadata.get(names.PLUGIN_METADATA_KEYS[-1]):
        return "absent"
    if metadata.get(names.PLUGIN_STATE_METADATA_KEYS[-1]) == names.PLUGIN_IDLE:
        return "idle"
    return "running"


async def plugin_status(client: Client) -> PluginStatus:
    """Whether the scheduler of the asynchronous ``client`` (or of a client whose
    loop this runs on) runs the plugin (``"running"``), has one that is idle (its
    configuration cannot work: its ERROR line in the scheduler's log says why) or
    none (``"absent"``)."""
    return status_of(await plugin_metadata(client))


async def plugin_running(client: Client) -> bool:
    """Whether the scheduler of the asynchronous ``client`` (or of a client whose
    loop this runs on) runs the plugin, not idle (:func:`plugin_status`)."""
    return await plugin_status(client) == "running"


async def _check_plugin(client: Client, address: str) -> None:
    try:
        status = await plugin_status(client)
    except Exception as e:  # (the scheduler went away: nothing to say about it)
        logger.debug("dask_otel_spans: cannot ask %s for the plugin: %s", address, e)
        return
    if status == "absent":
        logger.warning(
            "dask_otel_spans: the scheduler at %s runs no dask_otel_spans plugin, so "
            "this client's spans are not exported: %s (started with the preload, its "
            "log says why the plugin did not load: \"Failed to start preload: "
            "dask_otel_spans\")", address, PLUGIN_FIX)
    elif status == "idle":
        logger.warning(
            "dask_otel_spans: the dask_otel_spans plugin of the scheduler at %s is "
            "idle, so this client's spans are not exported: its ERROR line in the "
            "scheduler's log says why", address)

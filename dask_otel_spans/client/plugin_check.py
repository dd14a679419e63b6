"""Whether a client's scheduler runs the plugin: asked once per client and scheduler
address, in the background, off the submissions' path; one WARNING naming the fix
when it does not."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

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

#: (client id, scheduler address) of the clients whose scheduler was asked whether
#: it runs the plugin
_PLUGIN_CHECKED: set[tuple[str, str]] = set()

def check_plugin_soon(client: Client) -> None:
    """Once per client and scheduler address, ask that scheduler in the background
    whether it runs the plugin (the metadata a running plugin sets); when it does
    not, one WARNING naming the fix. Adds no wait to the caller and never raises."""
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


async def plugin_running(client: Client) -> bool:
    """Whether the scheduler of the asynchronous ``client`` (or of a client whose
    loop this runs on) runs the plugin: the metadata a running plugin sets, asked
    for in one message, no code run on the scheduler."""
    scheduler = client.scheduler
    if scheduler is None:  # (a closed client: as reading the attribute of None did)
        raise AttributeError("the client is closed: it has no scheduler")
    version = await scheduler.get_metadata(
        keys=list(names.PLUGIN_METADATA_KEYS), default=None)
    return bool(version)


async def _check_plugin(client: Client, address: str) -> None:
    try:
        running = await plugin_running(client)
    except Exception as e:  # (the scheduler went away: nothing to say about it)
        logger.debug("dask_otel_spans: cannot ask %s for the plugin: %s", address, e)
        return
    if not running:
        logger.warning(
            "dask_otel_spans: the scheduler at %s runs no dask_otel_spans plugin, so "
            "this client's spans are not exported: %s", address, PLUGIN_FIX)

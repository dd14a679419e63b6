"""What the scheduler plugin tells clients: the metadata they ask for once (whether
the scheduler has the plugin, running or idle) and the handler they ask for its
export state (:func:`~dask_otel_spans.client.wait_for_export`)."""
from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from dask_otel_spans import names
from dask_otel_spans.client.state import scheduler_state

if TYPE_CHECKING:
    from distributed import Scheduler

logger = logging.getLogger(__name__)


def announce(scheduler: Scheduler, running: bool) -> None:
    """Tell clients that ``scheduler`` has the plugin, ``running`` or idle (its
    configuration cannot work), and register the handler they ask for its state
    (:data:`~dask_otel_spans.names.STATE_HANDLER`)."""
    state = names.PLUGIN_RUNNING if running else names.PLUGIN_IDLE
    scheduler.set_metadata(keys=list(names.PLUGIN_METADATA_KEYS), value=names.VERSION)
    scheduler.set_metadata(keys=list(names.PLUGIN_STATE_METADATA_KEYS), value=state)
    scheduler.handlers[names.STATE_HANDLER] = state_handler(scheduler)


def withdraw(scheduler: Scheduler) -> None:
    """Undo :func:`announce` (the scheduler has no plugin any more)."""
    scheduler.set_metadata(keys=list(names.PLUGIN_METADATA_KEYS), value=None)
    scheduler.set_metadata(keys=list(names.PLUGIN_STATE_METADATA_KEYS), value=None)
    scheduler.handlers.pop(names.STATE_HANDLER, None)


def state_handler(
    scheduler: Scheduler,
) -> Callable[..., Coroutine[Any, Any, dict[str, Any] | None]]:
    """The scheduler handler :data:`~dask_otel_spans.names.STATE_HANDLER` of
    ``scheduler``: the :class:`~dask_otel_spans.client.state.ExportState` of the
    plugin registered on it when asked (None without one) as plain data; unlike
    ``run_on_scheduler``, no log line per question. A failure is one ERROR line and
    ``{"error": ...}``."""

    async def dask_otel_spans_state(flush: bool = False, exporters: bool = True,
                                    client: object = None,
                                    **kwargs: object) -> dict[str, Any] | None:
        try:
            state = await scheduler_state(
                scheduler, flush=bool(flush), exporters=bool(exporters),
                client=client if isinstance(client, str) else None)
        except Exception as e:
            logger.error("dask_otel_spans: a client's question for the export state "
                         "failed: %r", e)
            return {"error": repr(e)}
        return None if state is None else state.to_message()

    return dask_otel_spans_state

"""What the scheduler's plugin tells a client: its figures and where data goes, read
with ``client.run_on_scheduler`` (:func:`~dask_otel_spans.client.wait_for_export`)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dask_otel_spans import names
from dask_otel_spans.plugin import OTelSpansPlugin

if TYPE_CHECKING:
    from distributed import Scheduler


async def scheduler_state(dask_scheduler: Scheduler, flush: bool = False
                          ) -> dict[str, Any]:
    """The scheduler's plugin's figures and destinations, for a client:
    ``client.run_on_scheduler(scheduler_state)`` (``flush=True`` forwards what
    happened so far and flushes the exporters first). Empty without the plugin.

    Keys: ``open`` (spans not emitted yet), ``handed_over``, ``exported``,
    ``traces_to``, ``metrics_to``, ``export_process`` (bool), and the export
    session's other figures.
    """
    plugin = dask_scheduler.plugins.get(names.PLUGIN_NAME)
    if not isinstance(plugin, OTelSpansPlugin):
        return {}
    flushed = await plugin.flush() if flush else None
    out = {**plugin.export_stats(), **plugin.destinations}
    out["open"] = plugin.open_span_count
    if flushed is not None:
        out["flushed"] = flushed
    return out

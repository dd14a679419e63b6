"""What the scheduler's plugin tells a client: where data goes and how far export got
(:class:`ExportState`), read with ``client.run_on_scheduler``
(:func:`~dask_otel_spans.client.wait_for_export`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from dask_otel_spans import names
from dask_otel_spans.scheduler.plugin import OTelSpansPlugin

if TYPE_CHECKING:
    from distributed import Scheduler

#: ``traces_to`` and ``metrics_to`` of a plugin that could not set up its exporters
IDLE = "nowhere (the plugin is idle: its ERROR line in the scheduler's log says why)"


@dataclass(frozen=True)
class ExportState:
    """Where the scheduler's plugin sends data and how far export got, as the
    exporters reported it. The same fields in every state.

    Attributes
    ----------
    traces_to, metrics_to:
        Where traces and metrics go, in words (:data:`IDLE` when the plugin could
        not set up its exporters)
    export_process:
        Whether an export child process exports (else a thread of the scheduler)
    open:
        Dask spans not handed over yet (running, waiting for their block to close,
        or in their grace period)
    handed_over:
        Dask spans handed to the exporters (translated into OTel spans)
    traces_delivered, traces_failed:
        OTel spans the trace exporters reported delivered, and failed to deliver;
        None where the plugin did not build the exporters (given or global
        providers). With several exporters: the fewest delivered, the most failed.
    metrics_delivered, metrics_failed:
        Metric points the same way; None also for a pull reader (Prometheus: it is
        scraped, nothing is delivered)
    flushed:
        Whether the last flush finished in time and the last export of every
        exporter succeeded; None when no flush was asked for
    """

    traces_to: str
    metrics_to: str
    export_process: bool
    open: int
    handed_over: int
    traces_delivered: int | None
    traces_failed: int | None
    metrics_delivered: int | None
    metrics_failed: int | None
    flushed: bool | None


async def scheduler_state(dask_scheduler: Scheduler, flush: bool = False
                          ) -> ExportState | None:
    """The scheduler's plugin's :class:`ExportState`, for a client:
    ``client.run_on_scheduler(scheduler_state)`` (``flush=True`` forwards what
    happened so far and flushes the exporters first). None without the plugin."""
    plugin = dask_scheduler.plugins.get(names.PLUGIN_NAME)
    if not isinstance(plugin, OTelSpansPlugin):
        return None
    idle = plugin.transport is None
    flushed = (await plugin.flush() and not idle) if flush else None
    stats = plugin.export_stats()
    destinations = plugin.destinations

    def count(key: str) -> int | None:
        value = stats.get(key)
        return None if value is None else int(value)

    return ExportState(
        traces_to=str(destinations.get("traces_to", IDLE)),
        metrics_to=str(destinations.get("metrics_to", IDLE)),
        export_process=bool(destinations.get("export_process", False)),
        open=plugin.open_span_count,
        handed_over=plugin.handed_over_count,
        traces_delivered=count("traces_delivered"),
        traces_failed=count("traces_failed"),
        metrics_delivered=count("metrics_delivered"),
        metrics_failed=count("metrics_failed"),
        flushed=flushed,
    )

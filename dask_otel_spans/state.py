"""What the scheduler's plugin tells a client: where data goes and how far export got
(:class:`ExportState`), read with ``client.run_on_scheduler``
(:func:`~dask_otel_spans.client.wait_for_export`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

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
        Whether the last flush finished in time, the last export of every
        exporter succeeded and nothing is held; None when no flush was asked for
    held, spooled, dropped:
        Per signal (``traces``, ``metrics``, ``logs``) whose OTLP exporter holds
        what it could not deliver: items waiting in memory, waiting in the spool
        directory, and dropped past the spool's bounds (``otel-spans.spool.*``)
    spool:
        The spool directory (None: held batches stay in memory, or nothing holds)
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
    held: dict[str, int] = field(default_factory=dict)
    spooled: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)
    spool: str | None = None

    def figures(self) -> dict[str, Any]:
        """The figures as flat ``<signal>_<figure>`` keys (as the exporters count)."""
        out: dict[str, Any] = {
            "traces_delivered": self.traces_delivered, "traces_failed": self.traces_failed,
            "metrics_delivered": self.metrics_delivered,
            "metrics_failed": self.metrics_failed, "spool_directory": self.spool,
        }
        for name in ("held", "spooled", "dropped"):
            for signal, value in getattr(self, name).items():
                out[f"{signal}_{name}"] = value
        return out

    def outcome(self, signal: str = "traces") -> str:
        """What came of ``signal``'s export, in words: delivered, failed, still
        held, dropped (:func:`~dask_otel_spans.sdk.outcome.describe`)."""
        from dask_otel_spans.sdk.outcome import describe

        where = self.traces_to if signal == "traces" else self.metrics_to
        return describe(self.figures(), signal, where)


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
        **{name: {signal: int(stats[f"{signal}_{name}"])
                  for signal in ("traces", "metrics", "logs")
                  if stats.get(f"{signal}_{name}") is not None}
           for name in ("held", "spooled", "dropped")},
        spool=stats.get("spool_directory"),
    )

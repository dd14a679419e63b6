"""The export side's figures as typed records, from the session (and the export process)
to the scheduler plugin and on to a client's
:class:`~dask_otel_spans.client.state.ExportState`: the counts of each stage, the CPU
of each thread, and what came of each signal's export."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: The signals an export pipeline exports
SIGNALS = ("traces", "metrics", "logs")


@dataclass(frozen=True)
class SignalFigures:
    """What came of one signal's export, as the exporters built by the package count
    it (OTel spans, metric points, log records)."""

    #: items the backend acknowledged; None where no exporter of the signal was built
    #: by the package (given or global providers, a pull reader such as Prometheus)
    delivered: int | None = None
    #: items refused for good
    failed: int | None = None
    #: items waiting to be sent again: in memory, and in the spool directory only;
    #: None where nothing holds what this signal's exporters could not deliver
    held: int | None = None
    spooled: int | None = None
    #: items dropped past the spool's bounds (None: likewise)
    dropped: int | None = None
    #: items sent again after an attempt that got no answer within the exporter's
    #: timeout (or lost its connection after the request went out): the backend may
    #: have received them more than once (None: likewise)
    resent: int | None = None

    @property
    def counted(self) -> bool:
        """Whether the package's exporters count this signal."""
        return self.delivered is not None

    @property
    def waiting(self) -> int:
        """Items still held (in memory and in the spool directory)."""
        return (self.held or 0) + (self.spooled or 0)


@dataclass(frozen=True)
class ProcessFigures:
    """The export process's own figures (absent when the session runs in the
    scheduler process)."""

    pid: int = 0
    cpu_s: float = 0.0
    #: resident set size; Python's allocations alive when ``tracemalloc`` traces
    rss_bytes: int | None = None
    traced_bytes: int | None = None
    #: objects frozen out of collections, the youngest generation's threshold, the
    #: CPU of collections, and collections per generation
    gc_frozen_objects: int = 0
    gc_young_threshold: int = 0
    gc_cpu_s: float = 0.0
    gc_collections: tuple[int, ...] = ()


@dataclass(frozen=True)
class SenderFigures:
    """The scheduler side of the export process's pipe (absent with the session in
    the scheduler process)."""

    #: messages lost with an export process that died, and frames written
    lost: int = 0
    frames: int = 0
    #: messages not yet written (or lost)
    waiting: int = 0
    #: messages dropped past the forward budget, per kind
    dropped_by_kind: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ExportFigures:
    """The export session's figures: counts per stage (cumulative over the export
    processes of one plugin), its threads' CPU, and each signal's delivery."""

    #: messages received, the last one's position, spans handed over and spans ended
    #: (translated and ended in the tracer provider)
    received: int = 0
    last_position: int = -1
    handed_over: int = 0
    ended: int = 0
    #: spans open (not handed over yet), spans in the tree copy, readiness checks made
    open: int = 0
    #: of the open spans, those a client's close notice opened and the scheduler has
    #: not seen (no task): they wait for that client alone (its graph, or their idle
    #: or lazy timeout); and per client (the first 64 clients)
    waiting_on_clients: int = 0
    waiting_on_client: Mapping[str, int] = field(default_factory=dict)
    tree_spans: int = 0
    readiness_checks: int = 0
    #: messages that were not of the protocol; items the pipeline's queues dropped
    unreadable: int = 0
    queue_dropped: int = 0
    #: subtree summaries kept for parents still open
    summaries: int = 0
    #: metric updates summed, and SDK calls made with the sums
    metric_updates: int = 0
    metric_sdk_calls: int = 0
    #: CPU seconds of the session's, the ender's and the metrics threads
    session_cpu_s: float = 0.0
    ender_cpu_s: float = 0.0
    metrics_cpu_s: float = 0.0
    #: per signal (:data:`SIGNALS`)
    signals: Mapping[str, SignalFigures] = field(default_factory=dict)
    #: the spool directory (None: batches are held in memory only)
    spool_directory: str | None = None
    process: ProcessFigures | None = None
    sender: SenderFigures | None = None

    #: the counts that add up over the export processes of one plugin
    CUMULATIVE = ("received", "handed_over", "ended")

    def open_for(self, client: str | None) -> int:
        """The open spans that ``client`` waits for: all but those that wait for
        other clients alone (:attr:`waiting_on_clients`)."""
        if client is None:
            return self.open
        others = self.waiting_on_clients - self.waiting_on_client.get(client, 0)
        return max(0, self.open - others)

    def signal(self, name: str) -> SignalFigures:
        """The figures of signal ``name`` (all None and 0 when it is not counted)."""
        return self.signals.get(name) or SignalFigures()

    def replace(self, **changes: Any) -> ExportFigures:
        """A copy with ``changes``."""
        return dataclasses.replace(self, **changes)

    def plus_counts(self, earlier: Mapping[str, int]) -> ExportFigures:
        """A copy whose :attr:`CUMULATIVE` counts include ``earlier`` (those of
        export processes that ended)."""
        return self.replace(**{name: getattr(self, name) + earlier.get(name, 0)
                               for name in self.CUMULATIVE})

    def flat(self) -> dict[str, object]:
        """Every figure under one flat name, for benchmarks and logs:
        ``<signal>_<figure>`` for the signals', ``process_cpu_s`` and
        ``gc_collections_<generation>`` for the process's, the others by their own
        names."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name not in ("signals", "process", "sender", "waiting_on_client")}
        for name, figures in self.signals.items():
            for f in dataclasses.fields(figures):
                out[f"{name}_{f.name}"] = getattr(figures, f.name)
        if self.process is not None:
            out.update(dataclasses.asdict(self.process))
            out["process_cpu_s"] = out.pop("cpu_s")
            for generation, n in enumerate(out.pop("gc_collections")):
                out[f"gc_collections_{generation}"] = n
        if self.sender is not None:
            out.update(dataclasses.asdict(self.sender))
        return out

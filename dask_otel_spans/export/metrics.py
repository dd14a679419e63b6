"""OTel instruments for dask's fine performance metrics: heartbeat deltas become
counter adds, summed per series and handed to the SDK on a thread of their own, with
caps on span-name and series cardinality."""
from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeAlias, TypeVar

from opentelemetry.context import Context
from opentelemetry.metrics import Counter, Meter
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    TraceFlags,
    set_span_in_context,
)

from dask_otel_spans import names
from dask_otel_spans.background import QueueThread, ThreadWorker
from dask_otel_spans.export.caps import SeriesCap, SpanNameCap
from dask_otel_spans.protocol.propagation import prefix_span_id

if TYPE_CHECKING:
    from opentelemetry.metrics import Histogram, UpDownCounter

logger = logging.getLogger(__name__)

V = TypeVar("V")

#: An instrument of :class:`DaskInstruments` (the series of its histogram are
#: recorded at once; only its counters' are summed)
Instrument: TypeAlias = "Counter | UpDownCounter | Histogram"


#: Bucket boundaries (seconds) of ``dask.span.duration``, given to the SDK as advice:
#: dask spans last from tens of milliseconds to hours, and the SDK's default
#: boundaries (0, 5, 10, ... 10000) are meant for milliseconds, which would put every
#: span shorter than 5 s in one bucket
SPAN_DURATION_BUCKETS = (
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
    1800.0, 3600.0, 7200.0, 14400.0, 43200.0, 86400.0,
)

#: The idle series' key in the series cache, beside a span name
_IDLE_KEY = ("execute", names.IDLE_PREFIX, names.IDLE_ACTIVITY, "seconds")


def unit_family(unit: object) -> tuple[str, str]:
    """``(instrument suffix, OTel unit)`` for a dask unit (as a heartbeat key has it)."""
    if isinstance(unit, str):
        return names.UNIT_FAMILIES.get(unit, names.CUSTOM_UNIT_FAMILY)
    return names.CUSTOM_UNIT_FAMILY


#: Metric updates that may wait for the metrics thread; past it they are dropped
#: and counted
MAX_QUEUE_SIZE = 10_000
#: Exemplar contexts remembered (one per running span and prefix that reported
#: lately; one of an older span is made again when asked for)
MAX_EXEMPLAR_CONTEXTS = 1024
#: Seconds between two hand-overs of the per-series sums to the OTel SDK (and at
#: every flush and at close): one SDK call per series that changed, however many
#: workers and heartbeats fed it; well below the metric export interval
SEND_INTERVAL = 1.0


def exemplar_context(trace: tuple[int, int, int] | None) -> Context | None:
    """A context holding the span ``(trace id, span id, trace flags)``, which a
    measurement recorded in it gets as its exemplar (when the trace is sampled, as
    the SDK's default ``trace_based`` exemplar filter asks); None for None."""
    if trace is None:
        return None
    trace_id, span_id, flags = trace
    return set_span_in_context(NonRecordingSpan(SpanContext(
        trace_id, span_id, is_remote=False, trace_flags=TraceFlags(flags)
    )))


class _Series:
    """One metric series: its instrument, attributes and identity, and the context
    of the span its points are exemplars of."""

    __slots__ = ("instrument", "attributes", "key", "context")

    def __init__(self, instrument: Instrument, attributes: dict[str, str]):
        self.instrument = instrument
        self.attributes = attributes
        #: set by the caller for series whose points have exemplars
        self.context: Context | None = None
        #: equal for equal (instrument, attributes): e.g. every span past the
        #: span-name cap lands in the same ``__other__`` series
        self.key = (id(instrument), *attributes.values())


class _Recent(Generic[V]):
    """Values by key, at most ``maxsize`` (then the oldest is forgotten: a value is
    made again when asked for), so that steady-state adds allocate nothing and its
    memory stays level once full."""

    def __init__(self, maxsize: int = 4096):
        self.maxsize = max(1, maxsize)
        self._data: OrderedDict[Hashable, V] = OrderedDict()
        self.get = self._data.get

    def __len__(self) -> int:
        return len(self._data)

    def put(self, key: Hashable, value: V) -> None:
        data = self._data
        data[key] = value
        if len(data) > self.maxsize:
            data.popitem(last=False)


class DaskInstruments:
    """The package's instruments on one meter; every method is thread-safe.

    Counter updates are summed per series and reach the SDK when :meth:`send` is
    called (the :class:`MetricsPump` does, at most every :data:`SEND_INTERVAL`): one SDK
    call per changed series, not one per heartbeat, worker and key. Histogram
    records go to the SDK at once.
    """

    def __init__(
        self, meter: Meter, span_names: SpanNameCap, series_cap: SeriesCap | None = None,
        prefix_spans: bool = True,
    ):
        self.span_names = span_names
        #: exemplars point at prefix spans (``prefix-spans``), else at dask spans
        self.prefix_spans = prefix_spans
        self.series_cap = series_cap if series_cap is not None else SeriesCap()
        self._span_counters = self._counters(meter, names.SPAN_ACTIVITY_PREFIX)
        self._worker_counters = self._counters(meter, names.WORKER_ACTIVITY_PREFIX)
        self.span_duration = meter.create_histogram(
            names.SPAN_DURATION,
            unit="s",
            description="Wall time of dask spans handed over",
            explicit_bucket_boundaries_advisory=SPAN_DURATION_BUCKETS,
        )
        self.span_active = meter.create_up_down_counter(
            names.SPAN_ACTIVE,
            unit="{span}",
            description="Dask spans open on the scheduler (not handed over yet)",
        )
        self.span_tasks = meter.create_up_down_counter(
            names.SPAN_TASKS,
            unit="{task}",
            description="Tasks of the open dask spans by state, as of their last "
                        "progress (live.interval)",
        )
        self._cache: _Recent[_Series] = _Recent()
        #: (trace, exemplar context) by (span id, prefix): a running span's heartbeats reuse
        #: its context (the spans that reported lately: one entry per span)
        self._contexts: _Recent[tuple[tuple[int, int, int], Context]] = _Recent(
            MAX_EXEMPLAR_CONTEXTS)
        #: (instrument, span name) -> the series of the instruments whose one
        #: attribute is the span name (duration, active spans)
        self._by_name: dict[tuple[int, str], _Series] = {}
        #: sums not handed to the SDK yet: series key -> [series, sum] (a list, summed
        #: in place: no type says what each of its items is)
        self._unsent: dict[tuple[Hashable, ...], list[Any]] = {}
        self._lock = threading.Lock()
        #: figures for tests and benchmarks: updates summed, SDK calls made
        self.updates = 0
        self.sdk_calls = 0

    @staticmethod
    def _counters(meter: Meter, prefix: str) -> dict[str, Counter]:
        out = {}
        families = [*names.UNIT_FAMILIES.values(), names.CUSTOM_UNIT_FAMILY]
        for suffix, otel_unit in families:
            out[suffix] = meter.create_counter(
                prefix + suffix,
                unit=otel_unit,
                description=f"Dask fine performance metrics ({suffix})",
            )
        return out

    def add_span_deltas(
        self,
        deltas: Mapping[Hashable, float],
        span_tags: Mapping[str, Sequence[str]],
        span_traces: Mapping[str, tuple[int, int, int]] | None = None,
    ) -> None:
        """Heartbeat deltas ``{(context, span_id, prefix, activity, unit): value}``;
        ``span_tags`` maps the span ids in them to the span's tags, and
        ``span_traces`` to its ``(trace id, OTel span id, trace flags)``: the sums
        get exemplars of the span's prefix span (or of the span itself, without
        prefix spans)."""
        span_names: dict[Hashable, str] = {}  # the name of each span, once per call
        cache = self._cache
        for key, value in deltas.items():
            if not isinstance(key, tuple) or len(key) < 4:
                continue
            if not isinstance(value, (int, float)) or value <= 0:
                # counters are monotonic; dask's deltas are never negative
                continue
            span_id = key[1]
            name = span_names.get(span_id)
            if name is None:
                tags = span_tags.get(span_id, (str(span_id),))
                name = span_names[span_id] = self.span_names(tags)
            prefix = key[2] if len(key) >= 5 else None
            # (the series of a span name, context, prefix, activity and unit: the
            # spans of one name share it, so a new span seldom makes one)
            series = cache.get((name, key[0], prefix, key[-2], key[-1]))
            if series is None:
                series = self._span_series(name, key, prefix)
            series.context = self._exemplar_context(span_id, prefix, span_traces)
            self._sum(series, value)

    def _span_series(self, name: str, key: tuple[Hashable, ...], prefix: Hashable) -> _Series:
        """The series of heartbeat ``key`` of a span named ``name`` (made once)."""
        unit = key[-1]
        attrs = {
            names.SPAN_NAME: name,
            names.CONTEXT: str(key[0]),
            names.TASK_PREFIX: "" if prefix is None else str(prefix),
            names.ACTIVITY: str(key[-2]),
            names.UNIT: str(unit),
        }
        series = self._series(self._span_counters[unit_family(unit)[0]], attrs)
        self._cache.put((name, key[0], prefix, key[-2], unit), series)
        return series

    def _exemplar_context(self, span_id: str, prefix: Hashable,
                          span_traces: Mapping[str, tuple[int, int, int]] | None
                          ) -> Context | None:
        """The context of the span whose points are exemplars of ``span_id``'s
        keys of ``prefix``: its prefix span's (its own without prefix spans, and
        for the idle prefix)."""
        cached = self._contexts.get((span_id, prefix))
        trace = (span_traces or {}).get(span_id)
        if trace is None:  # (handed over lately: the context it had)
            return cached[1] if cached is not None else None
        if cached is not None and cached[0] == trace:
            return cached[1]
        # (new, or the span's trace learned since: a context that came late)
        key_trace = trace
        if self.prefix_spans and prefix is not None and prefix != names.IDLE_PREFIX:
            trace = (trace[0], prefix_span_id(span_id, str(prefix)), trace[2])
        context = exemplar_context(trace)
        if context is not None:
            self._contexts.put((span_id, prefix), (key_trace, context))
        return context

    def add_worker_deltas(self, deltas: Mapping[Hashable, float]) -> None:
        """Worker-wide heartbeat deltas ``{(context, ..., activity, unit): value}``."""
        for key, value in deltas.items():
            if not isinstance(key, tuple) or len(key) < 3:
                continue
            if not isinstance(value, (int, float)) or value <= 0:
                continue
            cache_key = ("worker", key)
            series = self._cache.get(cache_key)
            if series is None:
                attrs = {
                    names.CONTEXT: str(key[0]),
                    names.ACTIVITY: str(key[-2]),
                    names.UNIT: str(key[-1]),
                }
                series = self._series(
                    self._worker_counters[unit_family(key[-1])[0]], attrs
                )
                self._cache.put(cache_key, series)
            self._sum(series, value)

    def span_opened(self, tags: Sequence[str]) -> None:
        name = self.span_names(tags)
        self._sum(self._named_series(self.span_active, name), 1)

    def span_ended(
        self, tags: Sequence[str], duration: float, idle_seconds: float, opened: bool,
        trace: tuple[int, int, int] | None = None,
    ) -> None:
        """A span was ended: its duration, its closing ``idle or other spans``
        seconds, and (when it was counted as open) one fewer active span; ``trace``
        (its ``(trace id, OTel span id, trace flags)``) is the duration's exemplar."""
        name = self.span_names(tags)
        duration_series = self._named_series(self.span_duration, name)
        context = exemplar_context(trace)
        self.span_duration.record(max(0.0, duration), duration_series.attributes,
                                  context=context)
        if opened:
            self._sum(self._named_series(self.span_active, name), -1)
        if idle_seconds > 0:
            idle = self._cache.get((name, _IDLE_KEY))
            if idle is None:
                idle = self._series(self._span_counters["time"], {
                    names.SPAN_NAME: name,
                    names.CONTEXT: "execute",
                    names.TASK_PREFIX: names.IDLE_PREFIX,
                    names.ACTIVITY: names.IDLE_ACTIVITY,
                    names.UNIT: "seconds",
                })
                self._cache.put((name, _IDLE_KEY), idle)
            idle.context = context
            self._sum(idle, idle_seconds)

    def span_tasks_moved(self, tags: Sequence[str], moved: Mapping[str, int]) -> None:
        """Tasks of an open span that reached a state (``{dask.task.state: count}``,
        negative when a span's end takes them back) since its last progress."""
        name = self.span_names(tags)
        for state, count in moved.items():
            if not count:
                continue
            key = (id(self.span_tasks), f"{state}\x00{name}")
            series = self._by_name.get(key)
            if series is None:
                series = self._by_name[key] = self._series(self.span_tasks, {
                    names.SPAN_NAME: name, names.TASK_STATE: state})
            self._sum(series, count)

    def _series(self, instrument: Instrument, attributes: dict[str, str]) -> _Series:
        return _Series(instrument, self.series_cap(instrument, attributes))

    def _named_series(self, instrument: Instrument, name: str) -> _Series:
        """The series of ``instrument`` whose one attribute is the span name
        ``name`` (made once per name: the span-name cap bounds them)."""
        key = (id(instrument), name)
        series = self._by_name.get(key)
        if series is None:
            series = self._by_name[key] = self._series(
                instrument, {names.SPAN_NAME: name})
        return series

    def _sum(self, series: _Series, value: float) -> None:
        with self._lock:
            self.updates += 1
            entry = self._unsent.get(series.key)
            if entry is None:
                self._unsent[series.key] = [series, value]
            else:
                entry[1] += value
                if series.context is not None:  # (the latest span: the exemplar)
                    entry[0] = series

    @property
    def has_unsent(self) -> bool:
        return bool(self._unsent)

    def send(self) -> None:
        """Hand the sums to the SDK: one ``add`` per series that changed (an
        up-down sum that came back to zero is left out)."""
        with self._lock:
            unsent, self._unsent = self._unsent, {}
        for series, value in unsent.values():
            if value:
                series.instrument.add(value, series.attributes,
                                      context=series.context)
                self.sdk_calls += 1


#: An update of the instruments: an unbound method of :class:`DaskInstruments` (a
#: rename fails at import, not at run time on the metrics thread) and its arguments
MetricCall: TypeAlias = tuple[Callable[..., None], tuple[object, ...]]


class MetricsPump(ThreadWorker):
    """Runs instrument updates on a daemon thread, off the scheduler's event loop,
    and hands their sums to the SDK at most every ``send_interval`` seconds (and at
    every flush and at stop).

    ``submit`` never blocks: past ``max_queue_size`` pending items the item is dropped,
    counted in ``dropped`` and logged once.
    """

    def __init__(self, instruments: DaskInstruments,
                 max_queue_size: int = MAX_QUEUE_SIZE,
                 send_interval: float = SEND_INTERVAL):
        self.instruments = instruments
        self.send_interval = max(0.0, send_interval)
        self._next_send = 0.0
        self.thread = QueueThread(
            "dask-otel-spans-metrics", self._handle, maxsize=max(1, max_queue_size),
            what="metric updates", due=self.send_sums, due_in=self._send_in,
            counted_in="MetricsPump.dropped",
        )

    def send_sums(self) -> None:
        """Hand the sums to the SDK now."""
        self._next_send = time.monotonic() + self.send_interval
        self.instruments.send()

    def _send_in(self) -> float | None:
        if not self.instruments.has_unsent:
            return None
        return max(0.0, self._next_send - time.monotonic())

    def submit(self, method: Callable[..., None], *args: object) -> None:
        """Call ``method(instruments, *args)`` on the thread (``method`` a method of
        :class:`DaskInstruments`, e.g. ``DaskInstruments.add_worker_deltas``)."""
        self.thread.put((method, args))

    def submit_many(self, calls: list[MetricCall]) -> None:
        """:meth:`submit` each ``(method, args)`` of ``calls``, in one queue
        operation."""
        self.thread.put_many(calls)

    def _handle(self, item: MetricCall) -> None:
        method, args = item
        method(self.instruments, *args)
        if time.monotonic() >= self._next_send:
            self.send_sums()

"""A span visible while it runs: the export session's adapter over the live progress
bookkeeping (:mod:`~dask_otel_spans.export.tracking.progress`).

:class:`LiveRecords` is fed by the session (on its thread) and turns what the
bookkeeping says is due into ``dask.span.started`` and ``dask.span.progress`` log
records, pending spans (``live.pending-spans``) and ``dask.span.tasks`` updates.
The records and pending spans are made by :class:`LiveWriter` on the ender's thread,
in order with the spans it ends: a span's started record goes before it, and nothing
of a span goes after it. What is made: docs/data-contract.md, "While a span runs".
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import TYPE_CHECKING, NamedTuple

from distributed.metrics import time
from opentelemetry import trace
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags

from dask_otel_spans import names
from dask_otel_spans.config import PluginConfig
from dask_otel_spans.export.ender import HandOver
from dask_otel_spans.export.metrics import DaskInstruments, MetricCall, MetricsPump
from dask_otel_spans.export.tracking.progress import (
    LiveProgress,
    Progress,
    TaskCounts,
    is_over,
    task_counts,
)
from dask_otel_spans.export.tracking.readiness import ReadinessTracker
from dask_otel_spans.export.tracking.records import carried_for_translation
from dask_otel_spans.export.tracking.tree import SpanTree
from dask_otel_spans.logonce import OnceLogger
from dask_otel_spans.protocol.propagation import ChainIds, parse_carried, resolve_chain

if TYPE_CHECKING:
    from distributed.spans import Span
    from opentelemetry._logs import LoggerProvider
    from opentelemetry.context import Context
    from opentelemetry.trace import TracerProvider
    from opentelemetry.util.types import AttributeValue

    from dask_otel_spans.export.tracking.tree import TreeSpan

logger = logging.getLogger(__name__)


class LiveSpan(NamedTuple):
    """Who a record is about: the ids the span is exported with at its end."""

    tags: tuple[str, ...]
    dask_id: str
    parent_dask_id: str | None
    ids: ChainIds


def progress_attributes(progress: Progress, not_reported: int) -> dict[str, float]:
    """The attributes of a progress record (and of a pending span), past the span's
    name and id."""
    counts: TaskCounts = progress.counts
    out: dict[str, float] = {
        names.SPAN_ELAPSED: round(progress.elapsed, 3),
        names.SPAN_TASKS_DONE: counts.done,
        names.SPAN_TASKS_ERRED: counts.erred,
        names.SPAN_TASKS_RUNNING: counts.running,
        names.SPAN_TASKS_WAITING: counts.waiting,
        names.SPAN_TASKS_TOTAL: counts.total,
        names.SPAN_GROUPS_RUNNING: counts.groups_running,
        names.SPAN_GROUPS_DONE: counts.groups_done,
        names.SPAN_ACTIVITY_SECONDS: float(counts.activity_seconds),
        names.SPAN_ACTIVITY_BYTES: float(counts.activity_bytes),
    }
    if not_reported:
        out[names.LIVE_SPANS_NOT_REPORTED] = not_reported
    return out


def _tasks_by_state(counts: TaskCounts) -> dict[str, int]:
    """The tasks of a span by ``dask.task.state``, as ``dask.span.tasks`` counts them."""
    return {names.TASK_STATE_DONE: counts.done, names.TASK_STATE_ERRED: counts.erred,
            names.TASK_STATE_RUNNING: counts.running,
            names.TASK_STATE_WAITING: counts.waiting}


class LiveWriter:
    """Makes the live log records and pending spans (on the ender's thread).

    Parameters
    ----------
    logger_provider:
        Where the records go; None: no records
    tracer_provider:
        Where pending spans go; None: none
    """

    def __init__(self, logger_provider: LoggerProvider | None,
                 tracer_provider: TracerProvider | None):
        self._logger = (logger_provider.get_logger(names.INSTRUMENTATION_SCOPE,
                                                   names.VERSION)
                        if logger_provider is not None else None)
        self._tracer = (tracer_provider.get_tracer(names.INSTRUMENTATION_SCOPE,
                                                   names.VERSION)
                        if tracer_provider is not None else None)
        self._log_once = OnceLogger(logger)
        #: records and pending spans made
        self.records = 0
        self.pending_spans = 0

    @property
    def writes_records(self) -> bool:
        """Whether it makes log records."""
        return self._logger is not None

    @property
    def writes(self) -> bool:
        """Whether it makes anything (log records, or pending spans)."""
        return self._logger is not None or self._tracer is not None

    def started(self, span: LiveSpan, at: float) -> None:
        attributes: dict[str, AttributeValue] = self._own(span)
        if span.parent_dask_id is not None:
            attributes[names.SPAN_PARENT_ID] = span.parent_dask_id
        if span.ids.parent_span_id is not None:
            attributes[names.SPAN_PARENT_SPAN_ID] = f"{span.ids.parent_span_id:016x}"
        self._record(names.SPAN_STARTED_EVENT, span, at, attributes)

    def progress(self, span: LiveSpan, at: float, attributes: Mapping[str, AttributeValue],
                 pending: bool) -> None:
        attributes = {**self._own(span), **attributes}
        self._record(names.SPAN_PROGRESS_EVENT, span, at, attributes)
        if pending and self._tracer is not None:
            self._pending(span, at, attributes)

    @staticmethod
    def _own(span: LiveSpan) -> dict[str, AttributeValue]:
        return {names.SPAN_NAME: [str(t) for t in span.tags],
                names.SPAN_ID: span.dask_id}

    @staticmethod
    def _context(span: LiveSpan, remote: bool) -> Context:
        ids = span.ids
        return trace.set_span_in_context(trace.NonRecordingSpan(SpanContext(
            ids.trace_id, ids.span_id, is_remote=remote,
            trace_flags=TraceFlags(ids.trace_flags), trace_state=ids.trace_state)))

    def _record(self, event: str, span: LiveSpan, at: float,
                attributes: Mapping[str, AttributeValue]) -> None:
        if self._logger is None:
            return
        from opentelemetry._logs import SeverityNumber

        at_ns = int(at * 1e9)
        try:
            self._logger.emit(
                timestamp=at_ns, observed_timestamp=at_ns,
                context=self._context(span, remote=False),
                severity_number=SeverityNumber.INFO, severity_text="INFO",
                event_name=event, attributes=attributes,
            )
            self.records += 1
        except Exception as e:
            self._log_once("emit", "cannot emit %s log records (%s: "
                           "%s; logged once)", event, type(e).__name__, e)

    def _pending(self, span: LiveSpan, at: float,
                 attributes: Mapping[str, AttributeValue]) -> None:
        tracer = self._tracer
        if tracer is None:  # (pending spans off)
            return
        at_ns = int(at * 1e9)
        try:
            pending = tracer.start_span(
                str(span.tags[-1]) if span.tags else span.dask_id,
                context=self._context(span, remote=True), kind=SpanKind.INTERNAL,
                attributes={**attributes,
                            names.SPAN_STATE: names.SPAN_STATE_RUNNING},
                start_time=at_ns,
            )
            pending.end(end_time=at_ns)
            self.pending_spans += 1
        except Exception as e:
            self._log_once("pending", "cannot make pending spans "
                           "(%s: %s; logged once)", type(e).__name__, e)


class LiveRecords:
    """The session's side: feed the bookkeeping, hand what is due to the writer (on
    the ender's queue) and the ``dask.span.tasks`` updates to the metrics thread.

    Parameters
    ----------
    config:
        ``live.after``, ``live.interval``, ``live.pending-spans``
    tree, tracker:
        The session's span tree copy and readiness tracker (read only)
    enqueue:
        Puts a callable on the ender's queue (:meth:`SpanEnder.end_many`)
    writer:
        Makes the records and pending spans, on the ender's thread
    pump:
        The metrics thread; None: no metrics
    clock:
        Wall-clock seconds (the records' timestamps)
    """

    def __init__(self, config: PluginConfig, tree: SpanTree, tracker: ReadinessTracker,
                 enqueue: Callable[[list[Callable[[], None]]], None], writer: LiveWriter,
                 pump: MetricsPump | None = None, clock: Callable[[], float] = time):
        self.progress = LiveProgress(config.live_after, config.live_interval)
        self.pending_spans = config.live_pending_spans
        self.tree = tree
        self.tracker = tracker
        self.enqueue = enqueue
        self.writer = writer
        self.pump = pump
        self.clock = clock
        #: span id -> (tags, its tasks by state) last counted in ``dask.span.tasks``
        self._counted: dict[str, tuple[tuple[str, ...], dict[str, int]]] = {}

    @property
    def active(self) -> bool:
        """Whether anything is made (records, or metrics)."""
        return self.writer.writes or self.pump is not None

    def learned(self, span: Span) -> None:
        """The session added ``span`` to its tree."""
        if self.active:
            self.progress.learned(span.id, self.tree.chain_of(span), span.enqueued,
                                  self.clock())

    def graph(self, span_ids: Iterable[str]) -> None:
        self.progress.ids_final(span_ids)

    def ended(self, requests: Iterable[HandOver]) -> None:
        """These spans are handed over for export: the started records still due,
        to the ender's queue ahead of them; their counts out of ``dask.span.tasks``."""
        items: list[Callable[[], None]] = []
        for request in requests:
            span_id = request.ids[-1]
            counted = self._counted.pop(span_id, None)
            if counted is not None and self.pump is not None:
                tags, by_state = counted
                self.pump.submit(DaskInstruments.span_tasks_moved, tags, {
                    state: -n for state, n in by_state.items()})
            if self.progress.ended(span_id) and self.writer.writes_records:
                ids = resolve_chain(request.ids, parse_carried(request.carried) or {})
                span = self._live_span(request.tags, request.ids, ids)
                start = request.snapshot.enqueued if request.snapshot is not None \
                    else request.enter or request.now
                items.append(partial(self.writer.started, span, start))
        if items:
            self.enqueue(items)

    def look(self) -> None:
        """Make what is due now (every pass of the session)."""
        now = self.clock()
        counts = _PassCounts(self.tree.spans, self.tracker)
        look = self.progress.look(now, counts.of, counts.over)
        items = self._started_records(look.started, now)
        calls = []
        for progress in look.progress:
            span = self._open_live_span(progress.span_id)
            if span is None:
                continue
            if self.writer.writes:
                items.append(partial(self.writer.progress, span, now,
                                     progress_attributes(progress, look.not_reported),
                                     self.pending_spans))
            if self.pump is not None:
                calls.append(self._moved(span.tags, progress))
        if items:
            self.enqueue(items)
        if calls and self.pump is not None:
            self.pump.submit_many(calls)

    def _started_records(self, started: Iterable[str],
                         now: float) -> list[Callable[[], None]]:
        """The calls that make the started records of ``started`` (span ids)."""
        items: list[Callable[[], None]] = []
        if not self.writer.writes_records:
            return items
        spans = self.tree.spans
        for span_id in started:
            span = self._open_live_span(span_id)
            if span is not None:
                items.append(partial(self.writer.started, span,
                                     getattr(spans[span_id], "enqueued", now)))
        return items

    def _moved(self, tags: tuple[str, ...], progress: Progress) -> MetricCall:
        by_state = _tasks_by_state(progress.counts)
        _, before = self._counted.get(progress.span_id, (tags, {}))
        self._counted[progress.span_id] = (tags, by_state)
        return (DaskInstruments.span_tasks_moved, (tags, {
            state: n - before.get(state, 0) for state, n in by_state.items()}))

    def _open_live_span(self, span_id: str) -> LiveSpan | None:
        """The ids of an open span, as the translation will work them out."""
        rec = self.tracker.record(span_id)
        if rec is None:
            return None
        carried = carried_for_translation(rec, self.tracker.record(rec.ids[0]))
        ids = resolve_chain(rec.ids, parse_carried(carried) or {})
        return self._live_span(rec.tags, rec.ids, ids)

    @staticmethod
    def _live_span(tags: Iterable[str], chain: tuple[str, ...],
                   ids: ChainIds) -> LiveSpan:
        return LiveSpan(tuple(tags), chain[-1], chain[-2] if len(chain) > 1 else None,
                        ids)


class _PassCounts:
    """The task counts of the spans one pass looks at, each worked out once."""

    def __init__(self, spans: Mapping[str, TreeSpan], tracker: ReadinessTracker):
        self._spans = spans
        self._tracker = tracker
        self._counted: dict[str, TaskCounts] = {}

    def of(self, span_id: str) -> TaskCounts | None:
        counted = self._counted.get(span_id)
        if counted is None:
            span = self._spans.get(span_id)
            if span is None:
                return None
            counted = self._counted[span_id] = task_counts(span)
        return counted

    def over(self, span_id: str) -> bool:
        """Whether nothing of the span runs and its block closed (or it is done and
        idle): its last progress record is due."""
        rec = self._tracker.record(span_id)
        if rec is None or (rec.closed_at is None and rec.done_since is None):
            return False  # (the common case, without counting)
        counts = self.of(span_id)
        return counts is not None and is_over(
            counts, rec.closed_at is not None, rec.done_since is not None)

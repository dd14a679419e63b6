"""``SpanEnder``: translates the readiness tracker's requests (span snapshots) into
OTel spans and hands them to the tracer provider, on a thread of its own."""
from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import SpanLimits
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from dask_otel_spans import names
from dask_otel_spans.background import QueueThread, ThreadWorker
from dask_otel_spans.export.metrics import DaskInstruments, MetricCall, MetricsPump
from dask_otel_spans.export.traces import (
    SpanFields,
    SpanSummary,
    span_fields,
    subtree_summary,
    unseen_span_fields,
)
from dask_otel_spans.protocol.propagation import (
    parse_carried,
    resolve_chain,
    span_context_from_carrier,
)

if TYPE_CHECKING:
    from dask_otel_spans.export.task_spans import TaskSpanFields
    from dask_otel_spans.protocol.snapshots import SpanSnapshot

logger = logging.getLogger(__name__)

_IDLE_ATTRIBUTE = f"{names.METRICS_ATTRIBUTE_PREFIX}{names.IDLE_ACTIVITY}.seconds"
#: Spans ended whose metric updates go to the pump in one queue operation at most
METRIC_CALLS_PER_HAND_OVER = 256


class _PinnedIdGenerator(IdGenerator):
    """Hands the SDK the ids derived from dask span ids."""

    trace_id = 0
    span_id = 0

    def generate_span_id(self) -> int:
        return self.span_id

    def generate_trace_id(self) -> int:
        return self.trace_id

    def is_trace_id_random(self) -> bool:
        return False


def attribute_length_limit(provider: Any) -> int | None:
    """The attribute value length limit that spans of ``provider`` get: the SDK
    provider's own span limits when it has them, else the environment's
    (``OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT``, then
    ``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT``); None when there is none."""
    limits = getattr(provider, "_span_limits", None)
    if not isinstance(limits, SpanLimits):
        try:
            limits = SpanLimits()
        except ValueError:  # a malformed value: the SDK says so when it builds spans
            return None
    return limits.max_span_attribute_length


class HandOver(NamedTuple):
    """One dask span handed over, as the readiness tracker saw it."""

    tags: tuple[str, ...]
    #: chain of dask span ids, root first
    ids: tuple[str, ...]
    #: W3C headers carried from the client per dask span id, as sent (parsed
    #: by :meth:`SpanEnder.translate`); only the root's and the span's own
    carried: Mapping[str, Any]
    #: None for a span the scheduler never saw (no tasks): client times are used
    snapshot: SpanSnapshot | None
    now: float
    complete: bool
    close_reason: str
    #: client-side enter and exit times, from the close notice
    enter: float | None = None
    exit: float | None = None
    #: keep the subtree summary for the parent, which is still open
    keep_summary: bool = False
    #: whether the span was counted in ``dask.span.active``
    counted: bool = False
    #: W3C headers of the callers of bare submissions that landed in it
    links: tuple[Mapping[str, str], ...] = ()
    #: callers past ``names.MAX_SPAN_LINKS``, not linked
    links_dropped: int = 0


class SpanEnder(ThreadWorker):
    """End the OTel spans of each :class:`HandOver`, in order, on a daemon thread.

    Parameters
    ----------
    tracer_provider:
        Provider of the OTel spans; None to translate only (metrics still recorded)
    pump:
        Metrics thread that records each span's duration and idle time
    prefix_spans:
        Whether to add one child span per task prefix
    code_max_length:
        Include span code cut to this length; None leaves it out
    record_exceptions:
        Put the message and stack trace of erred tasks' exceptions on their spans
    exception_events:
        Record erred tasks' exceptions as ``exception`` span events (the default;
        ``OTEL_SEMCONV_EXCEPTION_SIGNAL_OPT_IN=logs`` turns them off)
    logger_provider:
        Where erred tasks' exceptions go as log events named ``exception``, in
        their task span's context (``OTEL_SEMCONV_EXCEPTION_SIGNAL_OPT_IN`` ``logs``
        or ``logs/dup``); None: no log events

    Notes
    -----
    Subtree summaries of spans whose parent is still open are kept in ``summaries``
    until the parent is ended, so that a parent never walks its ended children
    again; memory follows the open spans.
    """

    def __init__(
        self,
        tracer_provider: Any,
        pump: MetricsPump | None = None,
        *,
        prefix_spans: bool = True,
        code_max_length: int | None = None,
        record_exceptions: bool = True,
        exception_events: bool = True,
        logger_provider: Any = None,
    ):
        self.exception_events = exception_events
        self._exception_logger = (
            logger_provider.get_logger(names.INSTRUMENTATION_SCOPE, names.VERSION)
            if logger_provider is not None else None
        )
        #: exception log events made
        self.exception_logs = 0
        self.thread = QueueThread("dask-otel-spans-ender", self._end, what="spans",
                                  counted_in="SpanEnder.dropped",
                                  due=self._hand_metrics, due_in=self._metrics_in)
        self.pump = pump
        #: the metric updates of the spans ended since the pump was last handed
        #: some: one queue operation per batch of spans, not one per span
        self._metric_calls: list[MetricCall] = []
        self.prefix_spans = prefix_spans
        self.code_max_length = code_max_length
        self.record_exceptions = record_exceptions
        self.summaries: dict[str, SpanSummary] = {}
        #: dask spans ended (translated into OTel spans and ended in the tracer
        #: provider)
        self.ended_count = 0
        #: OTel spans ended (a dask span's own, and its prefix spans')
        self.otel_spans = 0
        self._ids = _PinnedIdGenerator()
        self._tracer = self._make_tracer(tracer_provider)
        #: span names (user data: tags, prefixes) are cut to the attribute value
        #: length limit, as the SDK cuts attribute values; None: no limit
        self.max_name_length = attribute_length_limit(tracer_provider)

    def _make_tracer(self, provider: Any) -> Any:
        if provider is None:
            return None
        tracer = provider.get_tracer(names.INSTRUMENTATION_SCOPE, names.VERSION)
        if hasattr(tracer, "id_generator"):
            # A private copy, so that the pinned ids affect no other user of the
            # provider's (cached) tracer.
            tracer = copy.copy(tracer)
            tracer.id_generator = self._ids
        else:
            logger.warning(
                "dask_otel_spans: tracer provider %r is not the OpenTelemetry SDK's: "
                "span ids will not follow the dask span ids", type(provider).__name__,
            )
        return tracer

    def end(self, request: HandOver) -> None:
        self.thread.put(request)

    def end_many(self, requests: list[HandOver]) -> None:
        """:meth:`end` each of ``requests``, in one queue operation."""
        self.thread.put_many(requests)

    def _end(self, request: HandOver | Callable[[], None]) -> None:
        if not isinstance(request, HandOver):
            # (a live record or pending span, in order with the spans:
            # dask_otel_spans/export/live.py)
            request()
            return
        fields, idle = self.translate(request)
        self.export(fields)
        self.ended_count += 1
        if self.pump is not None:
            ids = fields.ids
            self._metric_calls.append((DaskInstruments.span_ended, (
                request.tags, fields.duration_s, idle, request.counted,
                (ids.trace_id, ids.span_id, int(ids.trace_flags)),
            )))
            if len(self._metric_calls) >= METRIC_CALLS_PER_HAND_OVER:
                self._hand_metrics()

    def _metrics_in(self) -> float | None:
        return 0.0 if self._metric_calls else None

    def _hand_metrics(self) -> None:
        """Hand the pump the metric updates of the spans ended so far (when the
        ender's queue runs empty, every :data:`METRIC_CALLS_PER_HAND_OVER` spans,
        and before a flush or a stop completes)."""
        calls, self._metric_calls = self._metric_calls, []
        if calls and self.pump is not None:
            self.pump.submit_many(calls)

    def translate(self, request: HandOver) -> tuple[SpanFields, float]:
        """OTel fields of the (named) request, and its ``idle or other spans``
        seconds."""
        ids = resolve_chain(request.ids, parse_carried(request.carried) or {})
        snap = request.snapshot
        if snap is None:
            enter = request.enter if request.enter is not None else request.now
            exit_ = request.exit if request.exit is not None else request.now
            fields = unseen_span_fields(
                request.tags, request.ids[-1], ids, enter=enter, exit=exit_,
                close_reason=request.close_reason,
            )
            if not request.complete:
                fields.attributes[names.SPAN_INCOMPLETE] = True
            return self._linked(fields, request), 0.0
        summary = subtree_summary(snap, self.summaries)
        for child in snap.children:
            if isinstance(child, str):
                self.summaries.pop(child, None)
        if request.keep_summary:
            self.summaries[snap.id] = summary
        fields = span_fields(
            snap, ids, summary, now=request.now, complete=request.complete,
            close_reason=request.close_reason, prefix_spans=self.prefix_spans,
            code_max_length=self.code_max_length,
            record_exceptions=self.record_exceptions,
        )
        return (self._linked(fields, request),
                float(fields.attributes.get(_IDLE_ATTRIBUTE, 0.0)))

    @staticmethod
    def _linked(fields: SpanFields, request: HandOver) -> SpanFields:
        """``fields`` with the links to the request's callers (and the count of
        those past the cap)."""
        for headers in request.links:
            caller = span_context_from_carrier(headers)
            if caller is not None:
                fields.links.append(caller)
        if request.links_dropped:
            fields.attributes[names.SPAN_LINKS_DROPPED] = request.links_dropped
        return fields

    def export(self, fields: SpanFields) -> None:
        tracer = self._tracer
        if tracer is None:
            return
        parent = fields.ids.parent_context
        ctx = (
            trace.set_span_in_context(trace.NonRecordingSpan(parent))
            if parent is not None
            else Context()
        )
        self._ids.trace_id = fields.ids.trace_id
        otel_span = self._start_span(
            tracer, fields.name, fields.ids.span_id, ctx, fields.attributes,
            fields.start_ns, [Link(caller) for caller in fields.links],
        )
        if fields.error:
            otel_span.set_status(Status(StatusCode.ERROR, fields.error))
        if otel_span.is_recording():
            child_ctx = trace.set_span_in_context(otel_span)
            for prefix in fields.prefixes:
                child = self._start_span(
                    tracer, prefix.name, prefix.span_id, child_ctx, prefix.attributes,
                    prefix.start_ns,
                )
                if prefix.error:
                    child.set_status(Status(StatusCode.ERROR, prefix.error))
                if prefix.tasks:
                    self._task_spans(tracer, prefix.tasks,
                                     trace.set_span_in_context(child))
                child.end(end_time=prefix.end_ns)
                self.otel_spans += 1
            self._task_spans(tracer, fields.tasks, child_ctx)
        otel_span.end(end_time=fields.end_ns)
        self.otel_spans += 1

    def _task_spans(self, tracer: Any, tasks: list[TaskSpanFields],
                    parent: Context) -> None:
        for task in tasks:
            span = self._start_span(tracer, task.name, task.span_id, parent,
                                    task.attributes, task.start_ns)
            for event in task.events:
                if event.name != names.EXCEPTION_EVENT:
                    span.add_event(event.name, event.attributes,
                                   timestamp=event.time_ns)
                    continue
                if self.exception_events:
                    span.add_event(event.name, event.attributes,
                                   timestamp=event.time_ns)
                if self._exception_logger is not None:
                    try:
                        self._log_exception(span, event)
                    except Exception as e:  # the span is ended whatever happens here
                        self._exception_logger = None
                        logger.error(
                            "dask_otel_spans: cannot emit exception log events (%s: "
                            "%s; an OpenTelemetry SDK older than the log API's keyword "
                            "form?); exceptions are span events from now on",
                            type(e).__name__, e)
                        if not self.exception_events:
                            self.exception_events = True
                            span.add_event(event.name, event.attributes,
                                           timestamp=event.time_ns)
            if task.error:
                span.set_status(Status(StatusCode.ERROR, task.error))
            span.end(end_time=task.end_ns)
            self.otel_spans += 1

    def _log_exception(self, span: Any, event: Any) -> None:
        """An erred task's exception as a log event named ``exception``, in its task
        span's context (the semantic conventions' exception log event)."""
        from opentelemetry._logs import SeverityNumber

        assert self._exception_logger is not None  # (asked for: the caller checks)
        self._exception_logger.emit(
            timestamp=event.time_ns, observed_timestamp=event.time_ns,
            context=trace.set_span_in_context(span),
            severity_number=SeverityNumber.ERROR, severity_text="ERROR",
            event_name=names.EXCEPTION_EVENT, attributes=event.attributes,
        )
        self.exception_logs += 1

    def _start_span(
        self, tracer: Any, name: str, span_id: int, context: Context,
        attributes: dict[str, Any], start_ns: int, links: list[Link] | None = None,
    ) -> Any:
        self._ids.span_id = span_id
        limit = self.max_name_length
        if limit is not None and len(name) > limit:
            name = name[:limit]
        return tracer.start_span(
            name, context=context, kind=SpanKind.INTERNAL, attributes=attributes,
            links=links, start_time=start_ns,
        )

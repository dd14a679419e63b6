"""``SpanEnder``: translates the readiness tracker's requests (span snapshots) into
OTel spans and hands them to the tracer provider, on a thread of its own."""
from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, NamedTuple

from opentelemetry import trace

from dask_otel_spans import names
from dask_otel_spans.background import QueueThread, ThreadWorker
from dask_otel_spans.export.metrics import DaskInstruments, MetricCall, MetricsPump
from dask_otel_spans.export.profiles import (
    PrefixProfile,
    apply_profiles,
    write_profiles,
)
from dask_otel_spans.export.traces import (
    SpanFields,
    SpanSummary,
    span_fields,
    subtree_summary,
    unseen_span_fields,
)
from dask_otel_spans.export.writers import Parent, SpanWriter, parent_of
from dask_otel_spans.logonce import OnceLogger
from dask_otel_spans.protocol.propagation import (
    parse_carried,
    resolve_chain,
    span_context_from_carrier,
)

if TYPE_CHECKING:
    from opentelemetry._logs import LoggerProvider
    from opentelemetry.trace import SpanContext

    from dask_otel_spans.export.otlpprofiles import ProfileSender
    from dask_otel_spans.export.task_spans import TaskEvent, TaskSpanFields
    from dask_otel_spans.protocol.snapshots import SpanSnapshot

logger = logging.getLogger(__name__)

_IDLE_ATTRIBUTE = f"{names.METRICS_ATTRIBUTE_PREFIX}{names.IDLE_ACTIVITY}.seconds"
#: Spans ended whose metric updates go to the pump in one queue operation at most
METRIC_CALLS_PER_HAND_OVER = 256


class HandOver(NamedTuple):
    """One dask span handed over, as the readiness tracker saw it."""

    tags: tuple[str, ...]
    #: chain of dask span ids, root first
    ids: tuple[str, ...]
    #: W3C headers carried from the client per dask span id, as sent (parsed
    #: by :meth:`SpanEnder.translate`); only the root's and the span's own
    carried: Mapping[str, object]
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
    #: prefix -> its profile (``profile.enabled``; export/profiles.py)
    profiles: Mapping[str, PrefixProfile] | None = None


class SpanEnder(ThreadWorker):
    """End the OTel spans of each :class:`HandOver`, in order, on a daemon thread.

    Parameters
    ----------
    writer:
        How the OTel spans are ended (:func:`~dask_otel_spans.export.writers.span_writer`
        picks it for a tracer provider); None to translate only (metrics still
        recorded)
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
    profiles_dir:
        Where the embedded default writes (``profile.enabled``): each dask span's
        profiles go below it (:func:`~dask_otel_spans.export.profiles.write_profiles`)
    profile_sender:
        Where each dask span's profiles go as an OTLP profiles request
        (``profile.otlp``); None: not sent
    logger_provider:
        Where erred tasks' exceptions go as log events named ``exception``, in
        their task span's context (``OTEL_SEMCONV_EXCEPTION_SIGNAL_OPT_IN`` ``logs``
        or ``logs/dup``); None: no log events

    Notes
    -----
    The subtree summaries of spans handed over while their parent is open are added
    up in ``summaries``, one summary per open parent, until the parent is ended: a
    parent never walks its ended children again, and memory follows the open spans,
    not their children.
    """

    def __init__(
        self,
        writer: SpanWriter | None,
        pump: MetricsPump | None = None,
        *,
        prefix_spans: bool = True,
        code_max_length: int | None = None,
        record_exceptions: bool = True,
        exception_events: bool = True,
        logger_provider: LoggerProvider | None = None,
        profiles_dir: str | None = None,
        profile_sender: ProfileSender | None = None,
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
        #: span id -> the summary of its descendants handed over before it
        self.summaries: dict[str, SpanSummary] = {}
        #: dask spans ended (translated into OTel spans and ended in the tracer
        #: provider)
        self.ended_count = 0
        #: OTel spans ended (a dask span's own, and its prefix spans')
        self.otel_spans = 0
        self.writer = writer
        self.profiles_dir = profiles_dir
        self.profile_sender = profile_sender
        self._log_once = OnceLogger(logger)
        #: profile files written
        self.profile_files = 0

    def end(self, request: HandOver) -> None:
        self.thread.put(request)

    def end_many(self, requests: list[HandOver] | list[Callable[[], None]]) -> None:
        """:meth:`end` each of ``requests``, in one queue operation (or run each
        callable, in order with the spans: the live records of
        :mod:`~dask_otel_spans.export.live`)."""
        self.thread.put_many(requests)

    def _end(self, request: HandOver | Callable[[], None]) -> None:
        if not isinstance(request, HandOver):
            # (a live record or pending span, in order with the spans:
            # dask_otel_spans/export/live.py)
            request()
            return
        fields, idle = self.translate(request)
        self.export(fields)
        if request.profiles and self.profiles_dir is not None:
            self._write_profiles(fields, request.profiles)
        if request.profiles and self.profile_sender is not None:
            self.profile_sender.send(fields, request.profiles)
        self.ended_count += 1
        if self.pump is not None:
            ids = fields.ids
            self._metric_calls.append((DaskInstruments.span_ended, (
                request.tags, fields.duration_s, idle, request.counted,
                (ids.trace_id, ids.span_id, int(ids.trace_flags)),
            )))
            if len(self._metric_calls) >= METRIC_CALLS_PER_HAND_OVER:
                self._hand_metrics()

    def _write_profiles(self, fields: SpanFields,
                        profiles: Mapping[str, PrefixProfile]) -> None:
        assert self.profiles_dir is not None
        try:
            if write_profiles(self.profiles_dir, fields, profiles) is not None:
                self.profile_files += 1
        except OSError as e:
            self._log_once("profile-file", "cannot write profile files in %s (%s; "
                           "logged once)", self.profiles_dir, e)

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
            # (a span whose copy failed: what its descendants left goes with it)
            self.summaries.pop(request.ids[-1], None)
            return self._linked(fields, request), 0.0
        summary = subtree_summary(snap, self.summaries)
        for child in snap.children:
            if isinstance(child, str):
                self.summaries.pop(child, None)
        below = self.summaries.pop(snap.id, None)
        if below is not None:  # (its descendants handed over before it)
            summary.add(below)
        if request.keep_summary and len(request.ids) > 1:
            self._keep_for_parent(request.ids[-2], summary)
        fields = span_fields(
            snap, ids, summary, now=request.now, complete=request.complete,
            close_reason=request.close_reason, prefix_spans=self.prefix_spans,
            code_max_length=self.code_max_length,
            record_exceptions=self.record_exceptions,
        )
        if request.profiles:
            apply_profiles(fields, request.profiles)
        # (the idle metric attribute: a number, as span_fields sets it)
        return (self._linked(fields, request),
                float(fields.attributes.get(_IDLE_ATTRIBUTE, 0.0)))  # type: ignore[arg-type]

    def _keep_for_parent(self, parent_id: str, summary: SpanSummary) -> None:
        """Add the summary of a span handed over while its parent is open to what the
        parent's handed-over descendants sum to (one summary per open parent)."""
        kept = self.summaries.get(parent_id)
        if kept is None:
            kept = self.summaries[parent_id] = SpanSummary()
        kept.add(summary)

    @staticmethod
    def _linked(fields: SpanFields, request: HandOver) -> SpanFields:
        """``fields`` with its links: the context carried for the span in another
        trace than its tree's (:func:`resolve_chain`), then the other contexts later
        submissions carried for it and the callers of bare submissions, at most
        ``names.MAX_SPAN_LINKS`` (the count of those past the cap)."""
        dropped = request.links_dropped
        own = fields.ids.link
        if own is not None:
            fields.links.append(own)
        for headers in request.links:
            caller = span_context_from_carrier(headers)
            if caller is None or caller == own:
                continue
            if len(fields.links) < names.MAX_SPAN_LINKS:
                fields.links.append(caller)
            else:
                dropped += 1
        if dropped:
            fields.attributes[names.SPAN_LINKS_DROPPED] = dropped
        return fields

    def export(self, fields: SpanFields) -> None:
        """End the OTel spans of ``fields``: the dask span's, its prefix spans' and
        its task spans' (children before their parent)."""
        writer = self.writer
        if writer is None:
            return
        ids = fields.ids
        span = writer.start(fields.name, ids.trace_id, ids.span_id,
                            parent_of(ids.parent_context), fields.attributes,
                            fields.start_ns, fields.links)
        if span.recording:
            below = writer.below(span)
            for prefix in fields.prefixes:
                child = writer.start(prefix.name, ids.trace_id, prefix.span_id, below,
                                     prefix.attributes, prefix.start_ns)
                if prefix.tasks:
                    self._task_spans(writer, prefix.tasks, ids.trace_id,
                                     writer.below(child))
                writer.end(child, prefix.end_ns, error=prefix.error)
                self.otel_spans += 1
            self._task_spans(writer, fields.tasks, ids.trace_id, below)
        writer.end(span, fields.end_ns, error=fields.error)
        self.otel_spans += 1

    def _task_spans(self, writer: SpanWriter, tasks: list[TaskSpanFields],
                    trace_id: int, parent: Parent) -> None:
        for task in tasks:
            span = writer.start(task.name, trace_id, task.span_id, parent,
                                task.attributes, task.start_ns)
            events = self._events(task.events, span.span_context) if task.events else ()
            writer.end(span, task.end_ns, events, task.error)
            self.otel_spans += 1

    def _events(self, events: list[TaskEvent],
                context: SpanContext) -> list[TaskEvent]:
        """The events a task span gets; its ``exception`` event also as a log event
        in its context, when asked for."""
        out = []
        for event in events:
            if event.name != names.EXCEPTION_EVENT:
                out.append(event)
                continue
            if self.exception_events:
                out.append(event)
            if self._exception_logger is None:
                continue
            try:
                self._log_exception(context, event)
            except Exception as e:  # the span is ended whatever happens here
                self._exception_logger = None
                logger.error(
                    "dask_otel_spans: cannot emit exception log events (%s: "
                    "%s; an OpenTelemetry SDK older than the log API's keyword "
                    "form?); exceptions are span events from now on",
                    type(e).__name__, e)
                if not self.exception_events:
                    self.exception_events = True
                    out.append(event)
        return out

    def _log_exception(self, context: SpanContext, event: TaskEvent) -> None:
        """An erred task's exception as a log event named ``exception``, in its task
        span's context (the semantic conventions' exception log event)."""
        from opentelemetry._logs import SeverityNumber

        assert self._exception_logger is not None  # (asked for: the caller checks)
        self._exception_logger.emit(
            timestamp=event.time_ns, observed_timestamp=event.time_ns,
            context=trace.set_span_in_context(trace.NonRecordingSpan(context)),
            severity_number=SeverityNumber.ERROR, severity_text="ERROR",
            event_name=names.EXCEPTION_EVENT, attributes=event.attributes,
        )
        self.exception_logs += 1

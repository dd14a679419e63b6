"""How finished span fields become ended OTel spans: through the tracer API, or built
directly as the SDK's ``ReadableSpan`` and handed to the provider's span processors."""
from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

from opentelemetry import trace
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.context import Context
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanLimits
from opentelemetry.sdk.trace import Tracer as SdkTracer
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import DEFAULT_ON, Decision
from opentelemetry.sdk.util import BoundedList
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from dask_otel_spans import names

if TYPE_CHECKING:
    from opentelemetry.util.types import AttributeValue

    from dask_otel_spans.export.task_spans import TaskEvent

logger = logging.getLogger(__name__)

#: The W3C ``random`` trace flag, which SDKs since 1.3x carry from a parent to its
#: children (None on older SDKs, which do not): the one place the direct path
#: follows the SDK's version
_RANDOM_TRACE_ID: int | None = getattr(TraceFlags, "RANDOM_TRACE_ID", None)
_UNSET = Status(StatusCode.UNSET)
#: attribute value types that every supported SDK keeps as they are (sequences of one
#: of them as tuples)
_PLAIN_SET = frozenset({str, bool, int, float})
_SEQUENCES = frozenset({list, tuple})
_PLAIN_OR_SEQUENCE = _PLAIN_SET | _SEQUENCES


class Parent:
    """The parent of a span to start: its span context (None: a root) and the
    context that holds it, as the tracer and its sampler are given it (made when
    first asked for: the direct writer with the SDK's default sampler never asks)."""

    __slots__ = ("span_context", "_context")

    def __init__(self, span_context: SpanContext | None, context: Context | None = None):
        self.span_context = span_context
        self._context = context

    @property
    def context(self) -> Context:
        if self._context is None:
            self._context = (
                Context() if self.span_context is None
                else trace.set_span_in_context(trace.NonRecordingSpan(self.span_context)))
        return self._context


def parent_of(span_context: SpanContext | None) -> Parent:
    """The parent of a dask span's OTel span: the (remote) span context carried from
    the client or the parent dask span's, or none."""
    return Parent(span_context)


class Started:
    """A span started by a :class:`SpanWriter`, to be ended by the same writer."""

    __slots__ = ("span_context", "recording", "state")

    def __init__(self, span_context: SpanContext, recording: bool,
                 state: trace.Span | _Recorded | None = None):
        #: the span's own context (exception log events are made in it)
        self.span_context = span_context
        #: False when the sampler dropped it: ending it does nothing
        self.recording = recording
        #: what the writer needs to end it: :class:`ApiWriter`'s, the API span;
        #: :class:`DirectWriter`'s, what it recorded (None when not recording)
        self.state = state


class SpanWriter:
    """Turns span fields into ended OTel spans, with the ids derived from dask span ids.

    ``start`` a span, start its children below it (:meth:`below`), end them, then
    ``end`` it: children are ended before their parent, as the SDK's processors then
    see them. Names are cut to the attribute value length limit, as the SDK cuts
    attribute values.
    """

    #: span names are cut to this length; None: no limit
    max_name_length: int | None = None

    def start(self, name: str, trace_id: int, span_id: int, parent: Parent,
              attributes: Mapping[str, AttributeValue], start_ns: int,
              links: Sequence[SpanContext] = ()) -> Started:
        """Start the span ``span_id`` below ``parent`` (in ``trace_id`` when it has
        no valid parent), as the provider's sampler decides."""
        limit = self.max_name_length
        if limit is not None and len(name) > limit:
            name = name[:limit]
        return self._start(name, trace_id, span_id, parent, attributes, start_ns,
                           [Link(c) for c in links] if links else None)

    def _start(self, name: str, trace_id: int, span_id: int, parent: Parent,
               attributes: Mapping[str, AttributeValue], start_ns: int,
               links: list[Link] | None) -> Started:
        raise NotImplementedError

    def below(self, started: Started) -> Parent:
        """The parent that spans started below ``started`` get."""
        return Parent(started.span_context)

    def end(self, started: Started, end_ns: int, events: Sequence[TaskEvent] = (),
            error: str | None = None) -> None:
        """End ``started`` at ``end_ns`` with ``events`` and, when ``error`` is
        set, status ERROR with it as the description."""
        raise NotImplementedError


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


def attribute_length_limit(provider: trace.TracerProvider) -> int | None:
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


class ApiWriter(SpanWriter):
    """Through the tracer API: ``start_span``, ``add_event``, ``set_status``,
    ``end`` (any tracer provider; its processors' ``on_start`` runs).

    Parameters
    ----------
    tracer_provider:
        The provider of the spans; its tracer is copied, with ids pinned to those
        derived from dask span ids (an SDK tracer's: others make ids of their own)
    """

    def __init__(self, tracer_provider: trace.TracerProvider):
        self._ids = _PinnedIdGenerator()
        tracer = tracer_provider.get_tracer(names.INSTRUMENTATION_SCOPE, names.VERSION)
        if hasattr(tracer, "id_generator"):
            # A private copy, so that the pinned ids affect no other user of the
            # provider's (cached) tracer.
            tracer = copy.copy(tracer)
            tracer.id_generator = self._ids
        else:
            logger.warning(
                "dask_otel_spans: tracer provider %r is not the OpenTelemetry SDK's: "
                "span ids will not follow the dask span ids", type(tracer_provider).__name__,
            )
        self._tracer = tracer
        self.max_name_length = attribute_length_limit(tracer_provider)

    def _start(self, name: str, trace_id: int, span_id: int, parent: Parent,
               attributes: Mapping[str, AttributeValue], start_ns: int,
               links: list[Link] | None) -> Started:
        self._ids.trace_id = trace_id
        self._ids.span_id = span_id
        span = self._tracer.start_span(
            name, context=parent.context, kind=SpanKind.INTERNAL, attributes=attributes,
            links=links, start_time=start_ns,
        )
        return Started(span.get_span_context(), span.is_recording(), span)

    def below(self, started: Started) -> Parent:
        # (its state: the API span, as _start made it)
        return Parent(started.span_context,
                      trace.set_span_in_context(started.state))  # type: ignore[arg-type]

    def end(self, started: Started, end_ns: int, events: Sequence[TaskEvent] = (),
            error: str | None = None) -> None:
        span: trace.Span = started.state  # type: ignore[assignment]  # (as _start made it)
        for event in events:
            span.add_event(event.name, event.attributes, timestamp=event.time_ns)
        if error:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=end_ns)


class _Recorded(NamedTuple):
    """What a direct span keeps from its start to its end."""

    name: str
    parent: SpanContext | None
    attributes: Mapping[str, AttributeValue]
    links: list[Link] | None
    start_ns: int
    #: the SDK's own span metrics' end callback (SDKs that have them), or None
    end_metrics: Callable[[], None] | None


class DirectWriter(SpanWriter):
    """Builds each ended span as a ``ReadableSpan`` and hands it to the provider's span
    processors' ``on_end``, as the SDK's tracer would after ``start_span`` and
    ``end``: the provider's sampler decides, with the same arguments (the SDK's
    default, ``parentbased_always_on``, is decided here as it decides); its resource,
    the tracer's instrumentation scope and the provider's span limits are applied;
    ``on_start`` (and the SDK's experimental ``_on_ending``) is not called: the
    package's own batch processors do nothing there.

    Parameters
    ----------
    tracer:
        The OpenTelemetry SDK tracer of the package's scope, from the provider
    """

    def __init__(self, tracer: SdkTracer):
        self._sampler = tracer.sampler
        #: the SDK's default sampler (``parentbased_always_on``): decided here as it
        #: decides, without its context look-ups and result object
        self._default_sampler = tracer.sampler is DEFAULT_ON
        self._resource = tracer.resource
        self._processor = tracer.span_processor
        self._info = tracer.instrumentation_info
        self._scope = tracer._instrumentation_scope
        self._limits: SpanLimits = tracer._span_limits
        #: the SDK's own span metrics (``otel.sdk.span.*``), where it has them
        self._span_metrics = getattr(tracer, "_tracer_metrics", None)
        self.max_name_length = self._limits.max_span_attribute_length

    def _start(self, name: str, trace_id: int, span_id: int, parent: Parent,
               attributes: Mapping[str, AttributeValue], start_ns: int,
               links: list[Link] | None) -> Started:
        parent_context = parent.span_context
        if parent_context is not None and parent_context.is_valid:
            trace_id = parent_context.trace_id
        else:
            parent_context = None
        if self._default_sampler:
            # (ParentBased(ALWAYS_ON): the parent's sampled flag, else sampled; the
            # parent's trace state; the attributes as given)
            sampled = parent_context is None or parent_context.trace_flags.sampled
            decision = Decision.RECORD_AND_SAMPLE if sampled else Decision.DROP
            trace_state = parent_context.trace_state if parent_context is not None else None
        else:
            result = self._sampler.should_sample(parent.context, trace_id, name,
                                                 SpanKind.INTERNAL, attributes, links)
            decision, attributes, trace_state = (result.decision, result.attributes,
                                                 result.trace_state)
        flags = TraceFlags.SAMPLED if decision.is_sampled() else TraceFlags.DEFAULT
        if (_RANDOM_TRACE_ID is not None and parent_context is not None
                and parent_context.trace_flags & _RANDOM_TRACE_ID):
            flags |= _RANDOM_TRACE_ID
        context = SpanContext(trace_id, span_id, is_remote=False,
                              trace_flags=TraceFlags(flags), trace_state=trace_state)
        end_metrics = (self._span_metrics.start_span(parent_context, decision)
                       if self._span_metrics is not None else None)
        if not decision.is_recording():
            return Started(context, False)
        return Started(context, True, _Recorded(
            name, parent_context, attributes, links, start_ns, end_metrics))

    def end(self, started: Started, end_ns: int, events: Sequence[TaskEvent] = (),
            error: str | None = None) -> None:
        if not started.recording:
            return
        recorded: _Recorded = started.state  # type: ignore[assignment]  # (recording)
        limits = self._limits
        span = ReadableSpan(
            name=recorded.name,
            context=started.span_context,
            parent=recorded.parent,
            resource=self._resource,
            attributes=span_attributes(recorded.attributes, limits),
            events=self._events(events) if events else (),
            links=self._links(recorded.links) if recorded.links else (),
            kind=SpanKind.INTERNAL,
            instrumentation_info=self._info,
            status=Status(StatusCode.ERROR, error) if error else _UNSET,
            start_time=recorded.start_ns,
            end_time=end_ns,
            instrumentation_scope=self._scope,
        )
        if recorded.end_metrics is not None:
            recorded.end_metrics()
        self._processor.on_end(span)

    def _events(self, events: Sequence[TaskEvent]) -> BoundedList:
        limits = self._limits
        return BoundedList.from_seq(limits.max_events, [
            Event(event.name, BoundedAttributes(
                limits.max_event_attributes, event.attributes,
                max_value_len=limits.max_attribute_length,
            ), event.time_ns)
            for event in events
        ])

    def _links(self, links: list[Link]) -> BoundedList:
        limits = self._limits
        return BoundedList.from_seq(limits.max_links, [
            Link(link.context, BoundedAttributes(
                limits.max_link_attributes, link.attributes,
                max_value_len=limits.max_attribute_length,
            ))
            for link in links if link.context.is_valid
        ])


def span_attributes(attributes: Mapping[str, AttributeValue],
                    limits: SpanLimits) -> Mapping[str, AttributeValue]:
    """A span's attributes as the SDK keeps them under ``limits``: a plain copy (its
    sequences as tuples) when no value needs the SDK's cleaning and nothing is past a
    limit (most spans: the SDK's ``BoundedAttributes`` costs over 1 µs an
    attribute), else ``BoundedAttributes``, which cuts, drops and counts as the SDK
    does for ``start_span``."""
    count = limits.max_span_attributes
    length = limits.max_span_attribute_length
    if count is None or len(attributes) <= count:
        plain = _plain_copy(attributes, length)
        if plain is not None:
            return plain
    return BoundedAttributes(count, attributes, immutable=True, max_value_len=length)


def _plain_copy(attributes: Mapping[str, AttributeValue],
                length: int | None) -> dict[str, AttributeValue] | None:
    """``attributes`` with sequences as tuples, or None when a key or value is not
    one that every supported SDK keeps as it is (a non-empty str key; a value of
    exactly str, bool, int or float, or a list or tuple of one of them, strings
    within ``length``). (Type sets and ``map``: a loop in Python per attribute costs
    more than the rest of the span.)"""
    kinds = set(map(type, attributes.values()))
    if not kinds <= _PLAIN_OR_SEQUENCE or set(map(type, attributes)) != {str} \
            or "" in attributes:
        return None
    if (length is not None and str in kinds
            and max(len(v) for v in attributes.values() if type(v) is str) > length):
        return None
    out = dict(attributes)
    if kinds & _SEQUENCES:
        for key, value in out.items():
            if type(value) in _SEQUENCES:
                value = tuple(value)  # type: ignore[arg-type]  # (a list or a tuple)
                if not _plain_sequence(value, length):
                    return None
                out[key] = value
    return out


def _plain_sequence(values: tuple[AttributeValue, ...], length: int | None) -> bool:
    """Whether ``values`` are all of one plain type (strings within ``length``)."""
    if not values:
        return True
    kinds = set(map(type, values))
    if len(kinds) != 1 or not kinds <= _PLAIN_SET:
        return False
    # (len() only when they are all strings)
    return (str not in kinds or length is None
            or max(map(len, values)) <= length)  # type: ignore[arg-type]


def span_writer(tracer_provider: trace.TracerProvider | None, *,
                owned: bool) -> SpanWriter | None:
    """The writer of the spans of ``tracer_provider``: built directly
    (:class:`DirectWriter`) for a provider the package built and owns (the embedded
    default, every ``OTEL_*`` configuration), through the API (:class:`ApiWriter`)
    for any other (a user's: its processors' ``on_start`` runs); None without one."""
    if tracer_provider is None:
        return None
    if owned:
        tracer = tracer_provider.get_tracer(names.INSTRUMENTATION_SCOPE, names.VERSION)
        if isinstance(tracer, SdkTracer) and _enabled(tracer):
            return DirectWriter(tracer)
    return ApiWriter(tracer_provider)


def _enabled(tracer: SdkTracer) -> bool:
    """Whether the tracer makes spans (SDKs with tracer configurators can turn one off:
    its spans then take the API path, which says so)."""
    is_enabled = getattr(tracer, "_is_enabled", None)
    return is_enabled is None or bool(is_enabled())

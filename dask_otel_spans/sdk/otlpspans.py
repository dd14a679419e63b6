"""OTLP spans encoded straight from finished spans: the ``ExportTraceServiceRequest``
the SDK's exporter would send for a batch, byte for byte (:class:`SpanEncoding`), and
its OTLP/JSON as the package's file exporter writes it, key for key
(:class:`SpanJsonEncoding`), without building a protobuf object per span, attribute
and value (the SDK's encoder and protobuf's JSON printer spent most of the export
process's time there)."""
from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from dask_otel_spans.logonce import OnceLogger
from dask_otel_spans.sdk.protowire import (
    INT64_END,
    INT64_MIN,
    ONE_BYTE,
    Unusual,
    field,
    fixed32,
    fixed64,
    key_values,
    string,
    varint,
)

if TYPE_CHECKING:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )
    from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import Link

    from dask_otel_spans.sdk.otlpjsonshapes import JSONValue

logger = logging.getLogger(__name__)


def _unusual_attribute(key: str, value: object) -> bytes | None:
    """The ``KeyValue`` the installed SDK's encoder makes of an attribute whose value
    is not plain (``None``, bytes, a mapping, a subclass, an int out of range: SDK
    versions differ), or None when it leaves the attribute out."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.trace import INVALID_SPAN_CONTEXT

    attributes: dict[str, Any] = {key: value}
    request = encode_spans([ReadableSpan("", INVALID_SPAN_CONTEXT, resource=Resource({}),
                                         attributes=attributes)])
    encoded = request.resource_spans[0].scope_spans[0].spans[0].attributes
    return encoded[0].SerializeToString() if encoded else None


def _sdk_key_value(log: OnceLogger) -> Callable[[str, object], bytes | None]:
    """The ``KeyValue`` of an attribute whose value is not plain, as the installed
    SDK encodes it; None, logged once per key and class, when it leaves it out."""
    def key_value(key: str, value: object) -> bytes | None:
        kind = f"encode:{key}:{value.__class__.__qualname__}"
        pair = None if kind in log.kinds else _unusual_attribute(key, value)
        if pair is None:
            log(kind, "attribute %r (%s) cannot be encoded; left out of its spans, as "
                "the SDK's encoder leaves it out", key, value.__class__.__name__)
        return pair
    return key_value


def _probe(resource: Resource | None, scope: InstrumentationScope | None
           ) -> ExportTraceServiceRequest:
    """The SDK's encoding of one span with a local parent and a link, of ``resource``
    and ``scope``: what the encoders learn the SDK's ways from."""
    from opentelemetry.attributes import BoundedAttributes
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.trace import Link, SpanContext

    context = SpanContext(1, 1, False)
    return encode_spans([ReadableSpan(
        "probe", context, parent=context, resource=resource or Resource({}),
        instrumentation_scope=scope,
        links=[Link(context, BoundedAttributes(attributes={}))],
    )])


def _sdk_writes_flags() -> tuple[bool, bool]:
    """Whether the installed SDK writes the ``flags`` field of spans and of links."""
    span = _probe(None, None).resource_spans[0].scope_spans[0].spans[0]
    return span.flags != 0, span.links[0].flags != 0


#: what a request keeps of a resource or a scope, in one encoding
_Head = TypeVar("_Head")
#: one encoded span
_Part = TypeVar("_Part")


class _Heads(Generic[_Head]):
    """The resources' and scopes' parts of a request as the SDK encodes them (from
    its encoding of a probe span), made once per resource and scope."""

    def __init__(self, of_resource: Callable[[ResourceSpans], _Head],
                 of_scope: Callable[[ScopeSpans], _Head]):
        self._of_resource, self._of_scope = of_resource, of_scope
        self._resources: dict[Resource, _Head] = {}
        self._scopes: dict[InstrumentationScope | None, _Head] = {}

    def resource(self, resource: Resource) -> _Head:
        head = self._resources.get(resource)
        if head is None:
            head = self._of_resource(_probe(resource, None).resource_spans[0])
            if len(self._resources) < _HEADS_MAX:
                self._resources[resource] = head
        return head

    def scope(self, scope: InstrumentationScope | None) -> _Head:
        head = self._scopes.get(scope)
        if head is None:
            head = self._of_scope(_probe(None, scope).resource_spans[0].scope_spans[0])
            if len(self._scopes) < _HEADS_MAX:
                self._scopes[scope] = head
        return head


def _grouped(spans: Sequence[ReadableSpan], encode: Callable[[ReadableSpan], _Part]
             ) -> dict[Resource, dict[InstrumentationScope | None, list[_Part]]]:
    """``spans`` encoded, grouped by resource, then scope, in the order first seen,
    as the SDK groups them (equal resources together)."""
    groups: dict[Resource, dict[InstrumentationScope | None, list[_Part]]] = {}
    last_resource = last_scope = None
    last: list[_Part] = []
    for span in spans:
        resource, scope = span.resource, span.instrumentation_scope
        if resource is not last_resource or scope is not last_scope or not groups:
            last = groups.setdefault(resource, {}).setdefault(scope, [])
            last_resource, last_scope = resource, scope
        last.append(encode(span))
    return groups


class SpanEncoding:
    """What the installed SDK's encoder writes beside the spans' own fields, learnt
    from the SDK itself (probe spans through its public ``encode_spans``): each
    resource and scope as encoded, and whether spans and links carry the ``flags``
    field (OTLP 1.1; SDKs before it leave it out)."""

    def __init__(self) -> None:
        self.log = OnceLogger(logger)
        #: (the resource or scope field, its schema URL field)
        self.heads: _Heads[tuple[bytes, bytes]] = _Heads(
            lambda rs: (field(b"\x0a", rs.resource.SerializeToString()),
                        string(b"\x1a", rs.schema_url)),
            lambda ss: (field(b"\x0a", ss.scope.SerializeToString()),
                        string(b"\x1a", ss.schema_url)))
        self.span_flags, self.link_flags = _sdk_writes_flags()
        self._unusual = _sdk_key_value(self.log)

    def span(self, span: ReadableSpan) -> bytes:
        """One ``Span`` message, its fields in the order of their numbers."""
        context = span.context
        parent = span.parent
        parts = [b"\x0a\x10" + context.trace_id.to_bytes(16, "big"),
                 b"\x12\x08" + context.span_id.to_bytes(8, "big")]
        trace_state = context.trace_state
        if trace_state:
            parts.append(string(b"\x1a", ",".join(
                [f"{key}={value}" for key, value in trace_state.items()])))
        if parent is not None:
            parts.append(b"\x22\x08" + parent.span_id.to_bytes(8, "big"))
        if span.name:
            parts.append(field(b"\x2a", span.name.encode()))
        parts.append(_KINDS[span.kind.value])
        if span.start_time:
            parts.append(b"\x39" + fixed64(span.start_time))
        if span.end_time:
            parts.append(b"\x41" + fixed64(span.end_time))
        attributes = span.attributes
        if attributes:
            parts += key_values(b"\x4a", attributes, self._unusual)
            if span.dropped_attributes:
                parts.append(b"\x50" + varint(span.dropped_attributes))
        if span.events or span.links:
            self._events_and_links(span, parts)
        status = span.status
        description = status.description
        code = status.status_code.value
        parts.append(field(b"\x7a", (string(b"\x12", description) if description else b"")
                            + (b"\x18" + ONE_BYTE[code] if code else b"")))
        if self.span_flags:
            parts.append(_FLAGS_REMOTE if parent is not None and parent.is_remote
                         else _FLAGS_LOCAL)
        return b"".join(parts)

    def _events_and_links(self, span: ReadableSpan, parts: list[bytes]) -> None:
        for event in span.events:
            parts.append(field(b"\x5a", self._event(event)))
        if span.dropped_events:
            parts.append(b"\x60" + varint(span.dropped_events))
        for link in span.links:
            parts.append(field(b"\x6a", self._link(link)))
        if span.dropped_links:
            parts.append(b"\x70" + varint(span.dropped_links))

    def _event(self, event: Event) -> bytes:
        parts = [b"\x09" + fixed64(event.timestamp)] if event.timestamp else []
        if event.name:
            parts.append(string(b"\x12", event.name))
        parts += key_values(b"\x1a", event.attributes, self._unusual)
        dropped = getattr(event.attributes, "dropped", 0)
        if dropped:
            parts.append(b"\x20" + varint(dropped))
        return b"".join(parts)

    def _link(self, link: Link) -> bytes:
        context = link.context
        parts = [b"\x0a\x10" + context.trace_id.to_bytes(16, "big"),
                 b"\x12\x08" + context.span_id.to_bytes(8, "big")]
        parts += key_values(b"\x22", link.attributes, self._unusual)
        dropped = getattr(link.attributes, "dropped", 0)
        if dropped:
            parts.append(b"\x28" + varint(dropped))
        if self.link_flags:
            parts.append(b"\x35" + fixed32(0x300 if context.is_remote else 0x100))
        return b"".join(parts)

    def request(self, spans: Sequence[ReadableSpan]) -> bytes:
        """The ``ExportTraceServiceRequest`` of ``spans``; raises for a batch with a
        span that cannot be encoded (:meth:`request_of_encodable` leaves it out)."""
        return self._request(_grouped(spans, self.span))

    def request_of_encodable(self, spans: Sequence[ReadableSpan]
                             ) -> tuple[bytes, list[Exception]]:
        """The ``ExportTraceServiceRequest`` of those of ``spans`` that can be
        encoded, and why each of the others cannot (a time past what OTLP's unsigned
        64-bit nanoseconds hold, ...): what a batch that :meth:`request` cannot
        encode falls back to, span by span, so that one span does not take the others
        with it."""
        encoded: dict[int, bytes] = {}
        errors: list[Exception] = []
        for span in spans:
            try:
                encoded[id(span)] = self.span(span)
            except Exception as e:
                errors.append(e)
        kept = [span for span in spans if id(span) in encoded]
        return self._request(_grouped(kept, lambda span: encoded[id(span)])), errors

    def _request(self, grouped: dict[Resource, dict[InstrumentationScope | None,
                                                    list[bytes]]]) -> bytes:
        out = []
        for resource, scopes in grouped.items():
            resource_field, resource_schema = self.heads.resource(resource)
            scope_spans = []
            for scope, encoded in scopes.items():
                scope_field, scope_schema = self.heads.scope(scope)
                scope_spans.append(field(b"\x12", b"".join(
                    [scope_field, *[field(b"\x12", span) for span in encoded],
                     scope_schema])))
            out.append(field(b"\x0a", b"".join(
                [resource_field, *scope_spans, resource_schema])))
        return b"".join(out)



#: the ``kind`` field of each ``SpanKind`` value (OTLP's enum counts from 1)
_KINDS = [b"\x30" + ONE_BYTE[value + 1] for value in range(5)]
#: the ``flags`` field (number 16, fixed32): the parent's is-remote bit is known (0x100),
#: and set (0x200)
_FLAGS_LOCAL = b"\x85\x01" + fixed32(0x100)
_FLAGS_REMOTE = b"\x85\x01" + fixed32(0x300)
#: resources and scopes whose encoding is kept
_HEADS_MAX = 64


# -- OTLP/JSON ---------------------------------------------------------------------------

def _jsondouble(value: float) -> float | str:
    """A double as protobuf's JSON mapping writes it (``Infinity``, ``NaN`` as
    strings)."""
    if value != value:
        return "NaN"
    if value in (_INFINITY, -_INFINITY):
        return "Infinity" if value > 0 else "-Infinity"
    return value


_INFINITY = float("inf")


def _json_value(value: object) -> dict[str, JSONValue]:
    """An ``AnyValue`` of a plain value, as protobuf's JSON mapping writes it."""
    cls = value.__class__
    if cls is str:
        return {"stringValue": value}  # type: ignore[dict-item]
    if cls is int:
        if not INT64_MIN <= value < INT64_END:  # type: ignore[operator]
            raise Unusual
        return {"intValue": str(value)}
    if cls is float:
        return {"doubleValue": _jsondouble(value)}  # type: ignore[arg-type]
    if cls is bool:
        return {"boolValue": value}  # type: ignore[dict-item]
    if cls is tuple or cls is list:
        values: list[JSONValue] = [_json_value(v) for v in value]  # type: ignore[attr-defined]
        return {"arrayValue": {"values": values} if values else {}}
    raise Unusual


def _json_attributes(attributes: Mapping[str, object] | None,
                     log: OnceLogger) -> list[JSONValue]:
    """The ``KeyValue`` list of ``attributes`` (left out as the SDK leaves them out)."""
    out: list[JSONValue] = []
    if not attributes:
        return out
    for key, value in attributes.items():
        try:
            encoded: dict[str, JSONValue] = (
                {"key": key, "value": _json_value(value)} if key
                else {"value": _json_value(value)})
        except Unusual:
            kind = f"encode:{key}:{value.__class__.__qualname__}"
            pair = None if kind in log.kinds else _unusual_attribute(key, value)
            if pair is None:
                log(kind, "attribute %r (%s) cannot be encoded; left out of its spans, "
                    "as the SDK's encoder leaves it out", key, type(value).__name__)
                continue
            from google.protobuf.json_format import MessageToDict
            from opentelemetry.proto.common.v1.common_pb2 import KeyValue

            encoded = MessageToDict(KeyValue.FromString(pair), use_integers_for_enums=True)
        out.append(encoded)
    return out


class SpanJsonEncoding:
    """OTLP/JSON of finished spans, as the package's file exporter writes them:
    protobuf's JSON mapping of the SDK's ``ExportTraceServiceRequest`` (camelCase,
    64-bit integers as strings, enums as numbers, fields at their default left out)
    with trace and span ids in hex, key for key."""

    def __init__(self) -> None:
        from google.protobuf.json_format import MessageToDict

        self.log = OnceLogger(logger)
        #: (the resource or scope as the JSON mapping writes it, its schema URL)
        self.heads: _Heads[tuple[JSONValue, str]] = _Heads(
            lambda rs: (MessageToDict(rs.resource, use_integers_for_enums=True),
                        rs.schema_url),
            lambda ss: (MessageToDict(ss.scope, use_integers_for_enums=True),
                        ss.schema_url))
        self.span_flags, self.link_flags = _sdk_writes_flags()

    def span(self, span: ReadableSpan) -> dict[str, JSONValue]:
        """One span, its keys in the order of their field numbers."""
        context, parent = span.context, span.parent
        out: dict[str, JSONValue] = {"traceId": f"{context.trace_id:032x}",
                                     "spanId": f"{context.span_id:016x}"}
        if context.trace_state:
            out["traceState"] = ",".join(
                [f"{key}={value}" for key, value in context.trace_state.items()])
        if parent is not None:
            out["parentSpanId"] = f"{parent.span_id:016x}"
        if span.name:
            out["name"] = span.name
        out["kind"] = span.kind.value + 1
        if span.start_time:
            out["startTimeUnixNano"] = str(span.start_time)
        if span.end_time:
            out["endTimeUnixNano"] = str(span.end_time)
        attributes = _json_attributes(span.attributes, self.log)
        if attributes:
            out["attributes"] = attributes
        if span.dropped_attributes:
            out["droppedAttributesCount"] = span.dropped_attributes
        if span.events or span.links:
            self._events_and_links(span, out)
        status = span.status
        out["status"] = (({"message": status.description} if status.description else {})
                         | ({"code": status.status_code.value}
                            if status.status_code.value else {}))
        if self.span_flags:
            out["flags"] = 0x300 if parent is not None and parent.is_remote else 0x100
        return out

    def _events_and_links(self, span: ReadableSpan, out: dict[str, JSONValue]) -> None:
        events: list[JSONValue] = [self._event(event) for event in span.events]
        if events:
            out["events"] = events
        if span.dropped_events:
            out["droppedEventsCount"] = span.dropped_events
        links: list[JSONValue] = [self._link(link) for link in span.links]
        if links:
            out["links"] = links
        if span.dropped_links:
            out["droppedLinksCount"] = span.dropped_links

    def _put_attributes(self, out: dict[str, JSONValue],
                        attributes: Mapping[str, object] | None) -> None:
        """An event's or a link's attributes and their dropped count, where any."""
        encoded = _json_attributes(attributes, self.log)
        if encoded:
            out["attributes"] = encoded
        dropped = getattr(attributes, "dropped", 0)
        if dropped:
            out["droppedAttributesCount"] = dropped

    def _event(self, event: Event) -> dict[str, JSONValue]:
        out: dict[str, JSONValue] = {}
        if event.timestamp:
            out["timeUnixNano"] = str(event.timestamp)
        if event.name:
            out["name"] = event.name
        self._put_attributes(out, event.attributes)
        return out

    def _link(self, link: Link) -> dict[str, JSONValue]:
        context = link.context
        out: dict[str, JSONValue] = {"traceId": f"{context.trace_id:032x}",
                                     "spanId": f"{context.span_id:016x}"}
        self._put_attributes(out, link.attributes)
        if self.link_flags:
            out["flags"] = 0x300 if context.is_remote else 0x100
        return out

    def request(self, spans: Sequence[ReadableSpan]) -> dict[str, JSONValue]:
        """The ``ExportTraceServiceRequest`` of ``spans`` as OTLP/JSON."""
        resource_spans: list[JSONValue] = []
        for resource, scopes in _grouped(spans, self.span).items():
            resource_json, resource_schema = self.heads.resource(resource)
            scope_spans: list[JSONValue] = []
            for scope, encoded in scopes.items():
                scope_json, scope_schema = self.heads.scope(scope)
                spans_json: list[JSONValue] = list(encoded)
                one: dict[str, JSONValue] = {"scope": scope_json, "spans": spans_json}
                if scope_schema:
                    one["schemaUrl"] = scope_schema
                scope_spans.append(one)
            entry: dict[str, JSONValue] = {"resource": resource_json,
                                           "scopeSpans": scope_spans}
            if resource_schema:
                entry["schemaUrl"] = resource_schema
            resource_spans.append(entry)
        return {"resourceSpans": resource_spans} if resource_spans else {}

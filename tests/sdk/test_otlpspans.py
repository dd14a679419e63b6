"""The package's span encodings are the SDK's, for every field a span can carry: the
OTLP protobuf bytes, byte for byte, and the OTLP/JSON of the file exporter, key for key
(run on the newest and, in ``.ci/run``, the oldest supported SDK: what each writes is
learnt from it)."""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import NamedTuple

import pytest
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    Link,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)

from dask_otel_spans.sdk.otlpjson import to_otlp_json
from dask_otel_spans.sdk.otlpspans import SpanEncoding, SpanJsonEncoding

RESOURCE = Resource.create({"service.name": "dask", "k8s.pod.name": "scheduler-0"})
SCOPE = InstrumentationScope("dask_otel_spans", "1.2.3")
CONTEXT = SpanContext(0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, False,
                      TraceFlags(1))


def _span(name: str = "load", **fields: object) -> ReadableSpan:
    given = {"context": CONTEXT, "resource": RESOURCE, "instrumentation_scope": SCOPE,
             "start_time": 1_700_000_000_123_456_789, "end_time": 1_700_000_002_000_000_000,
             **fields}
    return ReadableSpan(name, **given)  # type: ignore[arg-type]


def _bounded(attributes: dict[str, object]) -> BoundedAttributes:
    """Event and link attributes as the SDK keeps them (its encoder before 1.27
    reads their ``dropped`` count)."""
    return BoundedAttributes(attributes=attributes)  # type: ignore[arg-type]


class Encoder(NamedTuple):
    """The package's encoding of a batch, and what the SDK makes of it."""

    request: Callable[[list[ReadableSpan]], object]
    sdk: Callable[[list[ReadableSpan]], object]


@pytest.fixture(params=["protobuf", "json"])
def encoding(request) -> Encoder:
    if request.param == "protobuf":
        return Encoder(SpanEncoding().request,
                       lambda spans: encode_spans(spans).SerializeToString())
    return Encoder(SpanJsonEncoding().request,
                   lambda spans: to_otlp_json(encode_spans(spans)))


@pytest.mark.parametrize("value", [
    "dask", "", "Ünïcode ✓", "x" * 300, True, False, 0, 1, 127, 128, 2**62, -1, -(2**63),
    0.0, 1.5, -2.25e-300, float("inf"), b"\x00\xff", ("a", "b"), (1, 2, 3), (True,),
    (0.5, 1.5), (), ["list", "of"], None, {"nested": 1}, ("a", None), 2**63,
    float("nan"), float("-inf"), ("x", 1),
], ids=repr)
def test_an_attribute_value_is_encoded_as_the_sdk_encodes_it(encoding, value):
    spans = [_span(attributes={"dask.value": value, "dask.span.name": "a"})]
    assert encoding.request(spans) == encoding.sdk(spans)


def test_every_span_field_is_encoded_as_the_sdk_encodes_it(encoding):
    remote = SpanContext(7, 8, True, TraceFlags(1), TraceState([("vendor", "v1")]))
    spans = [
        _span("with everything",
              context=SpanContext(CONTEXT.trace_id, 9, False, TraceFlags(1),
                                  TraceState([("a", "1"), ("b", "two")])),
              parent=remote, kind=SpanKind.SERVER,
              attributes={"dask.tasks": 12, "dask.ratio": 0.25, "dask.ok": True},
              events=[Event("exception", _bounded({"exception.type": "ValueError"}),
                            1_700_000_001),
                      Event("", _bounded({}), 5)],
              links=[Link(remote, _bounded({"dask.link": "x"})),
                     Link(CONTEXT, _bounded({}))],
              status=Status(StatusCode.ERROR, "ValueError: no")),
        _span("local child", parent=CONTEXT, kind=SpanKind.CLIENT,
              status=Status(StatusCode.OK)),
        _span("", kind=SpanKind.PRODUCER, start_time=None, end_time=None),
        _span("consumer", kind=SpanKind.CONSUMER, attributes={"": "empty key"}),
    ]
    assert encoding.request(spans) == encoding.sdk(spans)


def test_dropped_counts_are_encoded_as_the_sdk_encodes_them(encoding):
    provider = TracerProvider(resource=RESOURCE, span_limits=SpanLimits(
        max_span_attributes=2, max_events=1, max_links=1, max_event_attributes=1))
    span = provider.get_tracer("dask_otel_spans").start_span(
        "limited", attributes={"a": 1, "b": 2, "c": 3}, links=[Link(CONTEXT), Link(CONTEXT)])
    span.add_event("one", {"x": 1, "y": 2})
    span.add_event("two")
    span.end()
    finished = [span]
    assert finished[0].dropped_attributes and finished[0].dropped_events
    assert encoding.request(finished) == encoding.sdk(finished)


def test_spans_are_grouped_by_resource_and_scope_as_the_sdk_groups_them(encoding):
    other_resource = Resource.create({"service.name": "other"})
    equal_resource = Resource.create({"service.name": "dask", "k8s.pod.name": "scheduler-0"})
    other_scope = InstrumentationScope("dask_otel_spans.tasks", "1", "https://schema/1.26")
    spans = [_span("a"), _span("b", instrumentation_scope=other_scope),
             _span("c", resource=other_resource), _span("d", resource=equal_resource),
             _span("e", instrumentation_scope=None), _span("f")]
    assert encoding.request(spans) == encoding.sdk(spans)


def test_an_attribute_the_sdk_cannot_encode_is_left_out_with_one_log_line(encoding, caplog):
    spans = [_span(attributes={"dask.bad": 2**64, "dask.ok": "yes"}),
             _span("again", attributes={"dask.bad": 2**70})]
    with caplog.at_level(logging.WARNING, logger="dask_otel_spans.sdk.otlpspans"):
        ours = encoding.request(spans)
    assert ours == encoding.sdk(spans)
    ours_logged = [r for r in caplog.records if r.name == "dask_otel_spans.sdk.otlpspans"]
    assert len(ours_logged) == 1 and "dask.bad" in ours_logged[0].getMessage()

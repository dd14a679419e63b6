"""The holding span exporter hands each batch to the delivery encoded as the SDK would;
a span that cannot be encoded (a time past OTLP's unsigned 64-bit nanoseconds) is
dropped alone, counted as failed and said once, and the rest of its batch goes."""
from __future__ import annotations

import logging

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext, TraceFlags

from dask_otel_spans.sdk.health import ExportHealth
from dask_otel_spans.sdk.holding import HoldingSpanExporter

RESOURCE = Resource.create({"service.name": "dask"})
START = 1_700_000_000_000_000_000


class HeldBatches:
    """The delivery's side the exporter uses: what it was handed to hold."""

    def __init__(self) -> None:
        self.held: list[tuple[str, bytes, int]] = []

    def hold(self, signal: str, payload: bytes, items: int) -> None:
        self.held.append((signal, payload, items))

    def waiting(self) -> bool:
        return False


def _span(n: int, start: int = START, end: int = START + 10**9) -> ReadableSpan:
    return ReadableSpan(f"span-{n}", SpanContext(1, n, False, TraceFlags(1)),
                        resource=RESOURCE, start_time=start, end_time=end)


@pytest.fixture
def exporter() -> HoldingSpanExporter:
    return HoldingSpanExporter(HeldBatches(), ExportHealth("traces", "the receiver"))  # type: ignore[arg-type]


def test_a_batch_goes_as_the_sdk_encodes_it(exporter):
    spans = [_span(n) for n in range(1, 4)]
    exporter.export(spans)
    assert exporter.delivery.held == [  # type: ignore[attr-defined]
        ("traces", encode_spans(spans).SerializeToString(), 3)]
    assert exporter.health.failed == 0


@pytest.mark.parametrize("bad", [
    {"end": int(1e15 * 1e9)},  # (a close notice's exit of 1e15 s)
    {"start": -5 * 10**9},
    {"end": 1 << 64},
], ids=["1e15 s", "-5 s", "2**64 ns"])
def test_a_span_that_cannot_be_encoded_is_dropped_alone_and_counted(exporter, bad,
                                                                    caplog):
    good = [_span(1), _span(2), _span(4)]
    spans = [good[0], good[1], _span(3, **bad), good[2]]
    with caplog.at_level(logging.ERROR, logger="dask_otel_spans"):
        exporter.export(spans)
        exporter.export(spans)
    assert exporter.delivery.held == 2 * [  # type: ignore[attr-defined]
        ("traces", encode_spans(good).SerializeToString(), 3)]
    assert exporter.health.failed == 2 and not exporter.health.down
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith("dask_otel_spans: 1 span of a batch of 4 cannot be encoded")


def test_a_batch_of_spans_none_of_which_can_be_encoded_holds_nothing(exporter):
    exporter.export([_span(1, start=-1), _span(2, start=-2)])
    assert exporter.delivery.held == []  # type: ignore[attr-defined]
    assert exporter.health.failed == 2

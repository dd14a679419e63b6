"""The embedded default exporters write OTLP/JSON lines that read back losslessly."""
from __future__ import annotations

import json

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from dask_otel_spans.sdk.otlpjson import (
    OTLPJsonLinesMetricExporter,
    OTLPJsonLinesSpanExporter,
    latest_points,
    read_metric_points,
    read_spans,
)


def test_spans_round_trip_with_hex_ids(tmp_path):
    path = tmp_path / "traces.jsonl"
    provider = TracerProvider(resource=Resource.create({"service.name": "svc"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPJsonLinesSpanExporter(str(path))))
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("parent") as parent:
        with tracer.start_as_current_span("child", attributes={"k": ["a", "b"], "n": 3}):
            pass
    provider.shutdown()
    lines = path.read_text().splitlines()
    assert len(lines) == 2  # one export request per line
    assert all("resourceSpans" in json.loads(line) for line in lines)
    spans = {s["name"]: s for s in read_spans(str(path))}
    ctx = parent.get_span_context()
    assert spans["parent"]["traceId"] == f"{ctx.trace_id:032x}"
    assert spans["child"]["parentSpanId"] == f"{ctx.span_id:016x}"
    assert spans["child"]["attributes"] == {"k": ["a", "b"], "n": 3}
    assert spans["child"]["resource"]["service.name"] == "svc"


def test_metrics_round_trip(tmp_path):
    path = tmp_path / "metrics.jsonl"
    reader = PeriodicExportingMetricReader(
        OTLPJsonLinesMetricExporter(str(path)), export_interval_millis=3_600_000
    )
    provider = MeterProvider(metric_readers=[reader])
    counter = provider.get_meter("m").create_counter("c", unit="s")
    counter.add(1.5, {"a": "x"})
    reader.collect()
    counter.add(2.0, {"a": "x"})
    provider.shutdown()
    points = read_metric_points(str(path))
    assert [p["value"] for p in points] == [1.5, 3.5]  # cumulative
    [latest] = latest_points(points)
    assert latest["value"] == 3.5 and latest["unit"] == "s"


def test_unwritable_directory_fails_export_without_raising(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    exporter = OTLPJsonLinesSpanExporter(str(blocker / "traces.jsonl"))
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("t").start_as_current_span("x"):
        pass
    provider.shutdown()
    assert not blocker.read_text()

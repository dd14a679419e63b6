"""The package's metric encoding is the SDK's, byte for byte, for what a meter
provider collects: sums (monotonic or not, int and float), gauges, explicit-bucket
histograms, exemplars with and without a span, each temporality, any resource and
scope; what it does not write itself (exponential histograms, values of other
classes) is the SDK's own encoding (run on the newest and, in ``.ci/run``, the oldest
supported SDK)."""
from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common._internal.metrics_encoder import (
    EncodingException,
)
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import (
    Counter,
    Histogram,
    MeterProvider,
    ObservableGauge,
    UpDownCounter,
)
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    InMemoryMetricReader,
    Metric,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from dask_otel_spans.sdk.otlpmetrics import MetricEncoding

RESOURCE = Resource.create({"service.name": "dask", "k8s.pod.name": "scheduler-0"},
                           schema_url="https://opentelemetry.io/schemas/1.21.0")
SPAN = NonRecordingSpan(SpanContext(0x0AF7651916CD43DD8448EB211C80319C,
                                    0xB7AD6B7169203331, False, TraceFlags(1)))
ATTRIBUTES = {"dask.span.name": "load", "dask.task.prefix": "read-parquet",
              "count": 3, "ratio": 0.5, "on": True, "tags": ("a", "b"), "empty": ""}

Record = Callable[[MeterProvider], None]


def _collect(record: Record, *, temporality: AggregationTemporality | None = None,
             views: tuple[View, ...] = (), resource: Resource = RESOURCE,
             collections: int = 1) -> MetricsData:
    preferred = ({cls: temporality for cls in (Counter, UpDownCounter, Histogram,
                                               ObservableGauge)}
                 if temporality is not None else None)
    reader = InMemoryMetricReader(preferred_temporality=preferred)
    provider = MeterProvider(metric_readers=[reader], resource=resource, views=views)
    data = None
    for _ in range(collections):
        record(provider)
        data = reader.get_metrics_data()
    provider.shutdown()
    assert data is not None
    return data


def _same_as_sdk(data: MetricsData) -> None:
    assert MetricEncoding().request(data) == encode_metrics(data).SerializeToString()


def _counters(provider: MeterProvider) -> None:
    meter = provider.get_meter("dask_otel_spans", "1.2.3",
                               schema_url="https://opentelemetry.io/schemas/1.26.0")
    meter.create_counter("dask.span.activity.time", unit="s",
                         description="seconds").add(0.25, ATTRIBUTES)
    meter.create_counter("dask.tasks", unit="{task}").add(3, {"dask.task.prefix": "x"})
    meter.create_up_down_counter("dask.span.active").add(-2)


def _histograms(provider: MeterProvider) -> None:
    histogram = provider.get_meter("dask_otel_spans").create_histogram(
        "dask.span.duration", unit="s")
    for value in (0.002, 7.5, 1e6, 0.0):
        histogram.record(value, ATTRIBUTES)
    provider.get_meter("other").create_histogram("ints").record(5, {"k": "v"})


def _in_a_span(record: Record) -> Record:
    """``record`` with a sampled span current: the default exemplar filter keeps
    measurements with their span and trace ids."""
    def recorded(provider: MeterProvider) -> None:
        with trace.use_span(SPAN):
            record(provider)
    return recorded


def _gauge(provider: MeterProvider) -> None:
    def observe(options: CallbackOptions) -> list[Observation]:
        return [Observation(4, {"where": "scheduler"}), Observation(2.5, ATTRIBUTES)]
    provider.get_meter("dask_otel_spans").create_observable_gauge(
        "dask.workers", callbacks=[observe])


@pytest.mark.parametrize("temporality", [None, AggregationTemporality.DELTA],
                         ids=["cumulative", "delta"])
@pytest.mark.parametrize("record", [_counters, _histograms, _gauge], ids=lambda r: r.__name__)
def test_points_are_encoded_as_the_sdk_encodes_them(record, temporality):
    _same_as_sdk(_collect(record, temporality=temporality, collections=2))


@pytest.mark.parametrize("record", [_counters, _histograms], ids=lambda r: r.__name__)
def test_exemplars_with_their_span_are_encoded_as_the_sdk_encodes_them(record):
    data = _collect(_in_a_span(record))
    points = [p for rm in data.resource_metrics for sm in rm.scope_metrics
              for m in sm.metrics for p in m.data.data_points]
    assert any(p.exemplars and p.exemplars[0].span_id for p in points)
    _same_as_sdk(data)


def test_an_empty_resource_and_a_scope_without_version_are_encoded_as_the_sdk_does():
    _same_as_sdk(_collect(_gauge, resource=Resource({})))


def test_nothing_collected_is_encoded_as_the_sdk_encodes_it():
    _same_as_sdk(MetricsData(resource_metrics=[]))


def test_an_exponential_histogram_is_left_to_the_sdk():
    data = _collect(_histograms, views=(View(
        instrument_name="dask.span.duration",
        aggregation=ExponentialBucketHistogramAggregation()),))
    _same_as_sdk(data)


@pytest.mark.parametrize("value", [None, b"bytes", {"nested": 1}, 2**63, Decimal(1)],
                         ids=repr)
def test_a_value_of_another_class_is_encoded_by_the_sdk(value):
    """(As an attribute and as the point's value: a point built directly, as some
    SDK versions do not record such attributes.)"""
    def data(attributes: dict[str, object], value: object) -> MetricsData:
        point = NumberDataPoint(attributes, 1, 2, value)  # type: ignore[arg-type]
        metric = Metric("m", None, None, Sum([point], AggregationTemporality.CUMULATIVE,
                                             True))
        return MetricsData([ResourceMetrics(RESOURCE, [ScopeMetrics(
            InstrumentationScope("s"), [metric], "")], "")])
    _same_as_sdk(data({"odd": value, "k": "v"}, 1.5))
    if isinstance(value, int):
        with pytest.raises(EncodingException):  # (out of int64: the SDK's encoder's)
            MetricEncoding().request(data({}, value))

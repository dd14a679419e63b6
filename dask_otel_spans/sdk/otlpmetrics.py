"""OTLP metric points encoded straight from the SDK's ``MetricsData``: the
``ExportMetricsServiceRequest`` bytes its exporter would send, byte for byte
(:class:`MetricEncoding`), without a protobuf object per point, attribute and value
(the SDK's encoder spent about a tenth of the export process's time on ``nested``)."""
from __future__ import annotations

import logging
from collections.abc import Sequence
from struct import pack
from typing import TYPE_CHECKING

from dask_otel_spans.sdk.protowire import (
    INT64_END,
    INT64_MIN,
    Unusual,
    double,
    field,
    fixed64,
    key_values,
    sfixed64,
    string,
    varint,
)

if TYPE_CHECKING:
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceRequest,
    )
    from opentelemetry.sdk.metrics import Exemplar
    from opentelemetry.sdk.metrics.export import (
        Histogram,
        HistogramDataPoint,
        Metric,
        MetricsData,
        NumberDataPoint,
        Sum,
    )
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

logger = logging.getLogger(__name__)

#: resources and scopes whose encoding is kept
_HEADS_MAX = 64


def _int(tag: bytes, value: int) -> bytes:
    if not INT64_MIN <= value < INT64_END:
        raise Unusual
    return tag + sfixed64(value)


def _exemplars(tag: bytes, exemplars: Sequence[Exemplar]) -> list[bytes]:
    """``Exemplar`` fields, in the order of their numbers: time, a float value, the
    span and trace ids, an integer value, the filtered attributes."""
    out = []
    for exemplar in exemplars:
        time_ns, value = exemplar.time_unix_nano, exemplar.value
        parts = [b"\x11" + fixed64(time_ns)] if time_ns else []
        as_int = b""
        # (the SDK's order of checks: float, then int)
        if isinstance(value, float):
            parts.append(b"\x19" + double(value))
        elif isinstance(value, int):
            as_int = _int(b"\x31", value)
        else:
            raise Unusual
        if exemplar.span_id is not None and exemplar.trace_id is not None:
            parts.append(b"\x22\x08" + exemplar.span_id.to_bytes(8, "big")
                         + b"\x2a\x10" + exemplar.trace_id.to_bytes(16, "big"))
        parts.append(as_int)
        parts += key_values(b"\x3a", exemplar.filtered_attributes)
        out.append(field(tag, b"".join(parts)))
    return out


def _number_point(point: NumberDataPoint, start: bool) -> bytes:
    """A ``NumberDataPoint`` (``start``: with its start time, as the SDK writes a
    sum's and not a gauge's); an ``int`` value (``bool`` included) as an integer, a
    ``float`` as a double, as the SDK's encoder picks."""
    parts = []
    if start and point.start_time_unix_nano:
        parts.append(b"\x11" + fixed64(point.start_time_unix_nano))
    if point.time_unix_nano:
        parts.append(b"\x19" + fixed64(point.time_unix_nano))
    value = point.value
    if isinstance(value, int):
        parts += _exemplars(b"\x2a", point.exemplars)
        parts.append(_int(b"\x31", value))
    elif value.__class__ is float:
        parts.append(b"\x21" + double(value))
        parts += _exemplars(b"\x2a", point.exemplars)
    else:
        raise Unusual
    parts += key_values(b"\x3a", point.attributes)
    return b"".join(parts)


def _optional_double(tag: bytes, value: object) -> bytes:
    if value is None:
        return b""
    if value.__class__ is not float and value.__class__ is not int:
        raise Unusual
    return tag + double(value)


def _histogram_point(point: HistogramDataPoint) -> bytes:
    parts = []
    if point.start_time_unix_nano:
        parts.append(b"\x11" + fixed64(point.start_time_unix_nano))
    if point.time_unix_nano:
        parts.append(b"\x19" + fixed64(point.time_unix_nano))
    if point.count:
        parts.append(b"\x21" + fixed64(point.count))
    parts.append(_optional_double(b"\x29", point.sum))
    counts, bounds = point.bucket_counts, point.explicit_bounds
    if counts:
        parts.append(field(b"\x32", pack(f"<{len(counts)}Q", *counts)))
    if bounds:
        parts.append(field(b"\x3a", pack(f"<{len(bounds)}d", *bounds)))
    parts += _exemplars(b"\x42", point.exemplars)
    parts += key_values(b"\x4a", point.attributes)
    parts.append(_optional_double(b"\x59", point.min))
    parts.append(_optional_double(b"\x61", point.max))
    return b"".join(parts)


def _metric(metric: Metric) -> bytes:
    """A ``Metric``: a gauge, an explicit-bucket histogram or a sum, told apart as the
    SDK's encoder does (others: :class:`Unusual`, the SDK encodes the request)."""
    from opentelemetry.sdk.metrics.export import Gauge, Histogram, Sum

    data = metric.data
    parts = [string(b"\x0a", metric.name), string(b"\x12", metric.description),
             string(b"\x1a", metric.unit)]
    if not isinstance(data, (Gauge, Histogram, Sum)):
        raise Unusual
    if not data.data_points:
        return b"".join(parts)  # (the SDK sets the data field as it adds the points)
    if isinstance(data, Gauge):
        parts.append(field(b"\x2a", b"".join(
            [field(b"\x0a", _number_point(p, False)) for p in data.data_points])))
    elif isinstance(data, Histogram):
        body = [field(b"\x0a", _histogram_point(p)) for p in data.data_points]
        parts.append(field(b"\x4a", b"".join([*body, _temporality(data)])))
    else:
        body = [field(b"\x0a", _number_point(p, True)) for p in data.data_points]
        body.append(_temporality(data))
        if data.is_monotonic:
            body.append(b"\x18\x01")
        parts.append(field(b"\x3a", b"".join(body)))
    return b"".join(parts)


def _temporality(data: Histogram | Sum) -> bytes:
    temporality = int(data.aggregation_temporality)
    return b"\x10" + varint(temporality) if temporality else b""


class MetricEncoding:
    """The SDK encoder's ``ExportMetricsServiceRequest`` of a ``MetricsData``, byte for
    byte: sums, gauges and explicit-bucket histograms of plain values are written
    here, the resources and scopes as the SDK encodes them (learnt from its public
    ``encode_metrics`` once each); a request with anything else (exponential
    histograms, attribute values of other classes) is the SDK's own encoding."""

    def __init__(self) -> None:
        self._resources: dict[Resource, tuple[bytes, bytes]] = {}
        self._scopes: dict[InstrumentationScope, tuple[bytes, bytes]] = {}

    def request(self, data: MetricsData) -> bytes:
        try:
            return self._request(data)
        except Unusual:
            from opentelemetry.exporter.otlp.proto.common.metrics_encoder import (
                encode_metrics,
            )

            return encode_metrics(data).SerializeToString()

    def _request(self, data: MetricsData) -> bytes:
        # (grouped as the SDK groups them: by resource, then scope; a resource or
        # scope seen again replaces what came before it, as in the SDK's dicts)
        resources: dict[Resource, dict[InstrumentationScope, list[bytes]]] = {}
        for resource_metrics in data.resource_metrics:
            scopes: dict[InstrumentationScope, list[bytes]] = {}
            resources[resource_metrics.resource] = scopes
            for scope_metrics in resource_metrics.scope_metrics:
                scopes[scope_metrics.scope] = [
                    field(b"\x12", _metric(metric)) for metric in scope_metrics.metrics]
        out = []
        for resource, scopes in resources.items():
            resource_field, resource_schema = self._resource(resource)
            parts = [resource_field]
            for scope, metrics in scopes.items():
                scope_field, scope_schema = self._scope(scope)
                parts.append(field(b"\x12", b"".join([scope_field, *metrics, scope_schema])))
            parts.append(resource_schema)
            out.append(field(b"\x0a", b"".join(parts)))
        return b"".join(out)

    def _resource(self, resource: Resource) -> tuple[bytes, bytes]:
        head = self._resources.get(resource)
        if head is None:
            encoded = _probe(resource, None).resource_metrics[0]
            head = (field(b"\x0a", encoded.resource.SerializeToString()),
                    string(b"\x1a", encoded.schema_url))
            if len(self._resources) < _HEADS_MAX:
                self._resources[resource] = head
        return head

    def _scope(self, scope: InstrumentationScope) -> tuple[bytes, bytes]:
        head = self._scopes.get(scope)
        if head is None:
            encoded = _probe(None, scope).resource_metrics[0].scope_metrics[0]
            head = (field(b"\x0a", encoded.scope.SerializeToString()),
                    string(b"\x1a", encoded.schema_url))
            if len(self._scopes) < _HEADS_MAX:
                self._scopes[scope] = head
        return head


def _probe(resource: Resource | None, scope: InstrumentationScope | None
           ) -> ExportMetricsServiceRequest:
    """The SDK's encoding of ``resource`` with ``scope`` and no metrics."""
    from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
    from opentelemetry.sdk.metrics.export import MetricsData, ResourceMetrics, ScopeMetrics
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    scope = scope or InstrumentationScope("")
    return encode_metrics(MetricsData([ResourceMetrics(
        resource or Resource({}), [ScopeMetrics(scope, [], scope.schema_url or "")], "")]))

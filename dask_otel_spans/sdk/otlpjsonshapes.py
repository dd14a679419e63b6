"""The OTLP/JSON file format's messages, as the readers of
:mod:`~dask_otel_spans.sdk.otlpjson` use them (their fields are optional: protobuf's
JSON leaves out default values; int64 fields are decimal strings), and a JSON value."""
from __future__ import annotations

from typing import TypeAlias, TypedDict

#: A JSON value (as :func:`json.loads` makes it); also what an OTLP/JSON ``AnyValue``
#: decodes to (:func:`~dask_otel_spans.sdk.otlpjson.any_value`)
JSONValue: TypeAlias = "str | int | float | bool | None | list[JSONValue] | dict[str, JSONValue]"


class AnyValueJSON(TypedDict, total=False):
    stringValue: str
    boolValue: bool
    intValue: str | int
    doubleValue: float | str
    arrayValue: ArrayValueJSON
    kvlistValue: KeyValueListJSON
    bytesValue: str


class ArrayValueJSON(TypedDict, total=False):
    values: list[AnyValueJSON]


class KeyValueListJSON(TypedDict, total=False):
    values: list[KeyValueJSON]


class KeyValueJSON(TypedDict, total=False):
    key: str
    value: AnyValueJSON


class ResourceJSON(TypedDict, total=False):
    attributes: list[KeyValueJSON]


class SpanJSON(TypedDict, total=False):
    traceId: str
    spanId: str
    parentSpanId: str
    name: str
    kind: int
    startTimeUnixNano: str
    endTimeUnixNano: str
    attributes: list[KeyValueJSON]
    status: dict[str, JSONValue]


class ScopeSpansJSON(TypedDict, total=False):
    spans: list[SpanJSON]


class ResourceSpansJSON(TypedDict, total=False):
    resource: ResourceJSON
    scopeSpans: list[ScopeSpansJSON]


class DataPointJSON(TypedDict, total=False):
    """A number or a histogram data point."""

    attributes: list[KeyValueJSON]
    timeUnixNano: str
    asDouble: float | str
    asInt: str | int
    sum: float | str
    count: str | int


class MetricDataJSON(TypedDict, total=False):
    """A metric's ``sum``, ``gauge`` or ``histogram``."""

    dataPoints: list[DataPointJSON]


class MetricJSON(TypedDict, total=False):
    name: str
    unit: str
    sum: MetricDataJSON
    gauge: MetricDataJSON
    histogram: MetricDataJSON


class ScopeMetricsJSON(TypedDict, total=False):
    metrics: list[MetricJSON]


class ResourceMetricsJSON(TypedDict, total=False):
    resource: ResourceJSON
    scopeMetrics: list[ScopeMetricsJSON]


class LogRecordJSON(TypedDict, total=False):
    timeUnixNano: str
    observedTimeUnixNano: str
    eventName: str
    traceId: str
    spanId: str
    body: AnyValueJSON
    attributes: list[KeyValueJSON]


class ScopeLogsJSON(TypedDict, total=False):
    logRecords: list[LogRecordJSON]


class ResourceLogsJSON(TypedDict, total=False):
    resource: ResourceJSON
    scopeLogs: list[ScopeLogsJSON]


class ExportRequestJSON(TypedDict, total=False):
    """One line of a traces, metrics or logs file: an ``Export*ServiceRequest``."""

    resourceSpans: list[ResourceSpansJSON]
    resourceMetrics: list[ResourceMetricsJSON]
    resourceLogs: list[ResourceLogsJSON]

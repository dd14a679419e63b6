"""Holding exporters: thin adapters that stand in for the SDK's OTLP exporters of
the signals the package builds (spans, log records, delta metric points). A batch is
encoded at once into the OTLP request the SDK's exporter would send (byte for byte)
and handed to the :class:`~dask_otel_spans.sdk.delivery.Delivery`, whose thread sends
it, and holds and sends again what the receiver did not take: the batch processor's
thread never waits on the network, so its queue never fills while the collector is
away."""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    MetricExporter,
    MetricExportResult,
)
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from dask_otel_spans.logonce import OnceLogger
from dask_otel_spans.sdk.delivery import Delivery
from dask_otel_spans.sdk.health import ExportHealth, count_points
from dask_otel_spans.sdk.otlpmetrics import MetricEncoding
from dask_otel_spans.sdk.otlpspans import SpanEncoding
from dask_otel_spans.wording import counted

if TYPE_CHECKING:
    from opentelemetry.sdk._logs import ReadableLogRecord
    from opentelemetry.sdk.metrics.export import MetricsData
    from opentelemetry.sdk.trace import ReadableSpan

    from dask_otel_spans.sdk.logbase import LogRecordExporter

logger = logging.getLogger(__name__)

#: A batch of one signal: spans, log records, or an SDK ``MetricsData``
_Batch = TypeVar("_Batch")


def _hand_over(delivery: Delivery, health: ExportHealth,
               encode: Callable[[_Batch], bytes], batch: _Batch, items: int) -> None:
    """Encode ``batch`` (``items`` spans, records or points) and queue it for
    delivery; a batch that cannot be encoded is dropped, counted as failed."""
    try:
        payload = encode(batch)
    except Exception:
        logger.exception("dask_otel_spans: cannot encode a batch of %s; dropped "
                         "(counted as failed)", health.signal)
        health.record(False, items)
        return
    delivery.hold(health.signal, payload, items)


def _hand_over_spans(delivery: Delivery, health: ExportHealth, encoding: SpanEncoding,
                     spans: Sequence[ReadableSpan], log: OnceLogger) -> None:
    """Encode ``spans`` and queue them for delivery. A batch with a span that cannot
    be encoded is encoded again span by span (only then: the batch's usual encoding
    costs nothing more): that span is dropped alone, counted as failed and said
    once; the others go."""
    try:
        payload = encoding.request(spans)
        items = len(spans)
    except Exception:
        try:
            payload, errors = encoding.request_of_encodable(spans)
        except Exception:  # (not a span's fault: its resource or scope)
            _hand_over(delivery, health, encoding.request, spans, len(spans))
            return
        items = len(spans) - len(errors)
        health.unencodable(len(errors))
        log("unencodable", "%s of a batch of %d cannot be encoded (%s: %s); dropped "
            "alone and counted as failed, the others sent (said once; "
            "ExportState.traces_failed counts them all)",
            counted(len(errors), "span"), len(spans), type(errors[0]).__name__,
            errors[0], level=logging.ERROR)
        if not items:
            return
    delivery.hold(health.signal, payload, items)


def _encode_logs(batch: Sequence[ReadableLogRecord]) -> bytes:
    from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs

    return encode_logs(batch).SerializeToString()


class HoldingSpanExporter(SpanExporter):
    """Spans, sent and held by ``delivery`` (encoded by
    :class:`~dask_otel_spans.sdk.otlpspans.SpanEncoding`: the SDK's bytes, made
    without its per-value protobuf objects)."""

    def __init__(self, delivery: Delivery, health: ExportHealth):
        self.delivery = delivery
        self.health = health
        self.encoding = SpanEncoding()
        self._log_once = OnceLogger(logger)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        _hand_over_spans(self.delivery, self.health, self.encoding, spans,
                         self._log_once)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass  # (the delivery closes with the pipeline: it has the time left)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return not self.delivery.waiting()  # (the pipeline's flush drains it)


def holding_log_exporter(delivery: Delivery, health: ExportHealth) -> LogRecordExporter:
    """A log record exporter whose batches ``delivery`` sends and holds."""
    from dask_otel_spans.sdk.logbase import LogRecordExporter, LogRecordExportResult

    class HoldingLogExporter(LogRecordExporter):
        def export(self, batch: Sequence[ReadableLogRecord]) -> LogRecordExportResult:
            _hand_over(delivery, health, _encode_logs, batch, len(batch))
            return LogRecordExportResult.SUCCESS

        def shutdown(self) -> None:
            pass

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return not delivery.waiting()

    return HoldingLogExporter()


def prefers_delta(exporter: MetricExporter) -> bool:
    """Whether a metric exporter asks for delta temporality of some instrument
    (``OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE``): its points are then
    lost with a failed export, unless held."""
    preferred = getattr(exporter, "_preferred_temporality", None) or {}
    return AggregationTemporality.DELTA in set(preferred.values())


class HoldingMetricExporter(MetricExporter):
    """Delta metric points, sent and held by ``delivery`` (the temporality and
    aggregation preferences of the SDK exporter ``like``)."""

    def __init__(self, like: MetricExporter, delivery: Delivery, health: ExportHealth):
        super().__init__(
            preferred_temporality=getattr(like, "_preferred_temporality", None),
            preferred_aggregation=getattr(like, "_preferred_aggregation", None),
        )
        self.delivery = delivery
        self.health = health
        self.encoding = MetricEncoding()

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
               **kwargs: object) -> MetricExportResult:
        _hand_over(self.delivery, self.health, self.encoding.request, metrics_data,
                   count_points(metrics_data))
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        # (a metric reader's flush asks this after its export: the pipeline's flush
        # waits for the delivery itself, with the time it has left)
        return not self.delivery.waiting()

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: object) -> None:
        pass

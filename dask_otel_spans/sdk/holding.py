"""Holding exporters: thin adapters around the OTLP exporters the package builds
(spans, log records, delta metric points). While nothing of their signal is held, a
batch goes to the SDK's exporter (with its own retries); one it could not deliver is
encoded (the OTLP request the exporter would send) and handed to the
:class:`~dask_otel_spans.sdk.delivery.Delivery`, and so is every later batch while
anything older waits, so that batches arrive oldest first. The adapters count what
the exporter delivered; the delivery counts the rest."""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    MetricExporter,
    MetricExportResult,
)
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from dask_otel_spans.sdk.delivery import Delivery
from dask_otel_spans.sdk.health import ExportHealth, count_points

logger = logging.getLogger(__name__)


class _Holder:
    """What the three adapters share: try the exporter while nothing waits, else (or
    when it failed) encode and hold."""

    def __init__(self, inner: Any, delivery: Delivery, health: ExportHealth,
                 encode: Callable[[Any], bytes]):
        self.inner = inner
        self.delivery = delivery
        self.health = health
        self._encode = encode
        self._closed = False
        self._close_lock = threading.Lock()
        delivery.on_close(self.close_inner)

    def deliver(self, batch: Any, items: int, attempt: Callable[[], bool]) -> None:
        """Deliver ``batch`` (``items`` spans, records or points) with ``attempt``,
        or hold it."""
        signal = self.health.signal
        if self.delivery.direct(signal):
            try:
                ok = attempt()
            except Exception:
                ok = False
            if ok:
                self.health.record(True, items)
                return
        try:
            payload = self._encode(batch)
        except Exception:
            logger.exception("dask_otel_spans: cannot encode a batch of %s; dropped "
                             "(counted as failed)", signal)
            self.health.record(False, items)
            return
        self.delivery.hold(signal, payload, items)

    def close_inner(self) -> None:
        """Shut the SDK's exporter down once (a retry it is waiting in ends)."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self.inner.shutdown()


def _encode_spans(spans: Sequence[Any]) -> bytes:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    return encode_spans(spans).SerializeToString()


def _encode_logs(batch: Sequence[Any]) -> bytes:
    from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs

    return encode_logs(batch).SerializeToString()


def _encode_metrics(data: Any) -> bytes:
    from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics

    return encode_metrics(data).SerializeToString()


class HoldingSpanExporter(SpanExporter):
    """A span exporter whose undelivered batches are held and sent again."""

    def __init__(self, inner: SpanExporter, delivery: Delivery, health: ExportHealth):
        self._holder = _Holder(inner, delivery, health, _encode_spans)

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        inner = self._holder.inner
        self._holder.deliver(
            spans, len(spans), lambda: inner.export(spans) == SpanExportResult.SUCCESS)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self._holder.close_inner()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._holder.delivery.drain(timeout_millis / 1000)


def holding_log_exporter(inner: Any, delivery: Delivery, health: ExportHealth) -> Any:
    """A log record exporter whose undelivered batches are held and sent again."""
    from opentelemetry.sdk._logs.export import LogRecordExporter, LogRecordExportResult

    class HoldingLogExporter(LogRecordExporter):
        def __init__(self) -> None:
            self._holder = _Holder(inner, delivery, health, _encode_logs)

        def export(self, batch: Sequence[Any]) -> Any:
            self._holder.deliver(
                batch, len(batch),
                lambda: inner.export(batch) == LogRecordExportResult.SUCCESS)
            return LogRecordExportResult.SUCCESS

        def shutdown(self) -> None:
            self._holder.close_inner()

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return delivery.drain(timeout_millis / 1000)

    return HoldingLogExporter()


def prefers_delta(exporter: Any) -> bool:
    """Whether a metric exporter asks for delta temporality of some instrument
    (``OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE``): its points are then
    lost with a failed export, unless held."""
    preferred = getattr(exporter, "_preferred_temporality", None) or {}
    return AggregationTemporality.DELTA in set(preferred.values())


class HoldingMetricExporter(MetricExporter):
    """A delta metric exporter whose undelivered points are held and sent again
    (same temporality and aggregation preferences as the exporter)."""

    def __init__(self, inner: MetricExporter, delivery: Delivery, health: ExportHealth):
        super().__init__(
            preferred_temporality=getattr(inner, "_preferred_temporality", None),
            preferred_aggregation=getattr(inner, "_preferred_aggregation", None),
        )
        self._holder = _Holder(inner, delivery, health, _encode_metrics)

    def export(self, metrics_data: Any, timeout_millis: float = 10_000,
               **kwargs: Any) -> MetricExportResult:
        inner = self._holder.inner
        self._holder.deliver(
            metrics_data, count_points(metrics_data),
            lambda: inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)
            == MetricExportResult.SUCCESS)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._holder.delivery.drain(timeout_millis / 1000)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._holder.close_inner()

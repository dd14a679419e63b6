"""The OTLP exporter of cumulative metric points in the pipeline the package builds:
each collection encoded at once (:class:`~dask_otel_spans.sdk.otlpmetrics.MetricEncoding`,
the SDK's bytes) and sent by a request sender, tried again within the export's
timeout (``OTEL_EXPORTER_OTLP_[METRICS_]TIMEOUT``, as the SDK's exporter) while the
receiver answers that another try is worth it. Nothing is held: the
next export that succeeds carries the totals."""
from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult

from dask_otel_spans.sdk.delivery import RETRY_HINT_MAX, backoff
from dask_otel_spans.sdk.health import ExportHealth, count_points
from dask_otel_spans.sdk.otlpmetrics import MetricEncoding

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics.export import MetricsData

    from dask_otel_spans.sdk.otlpsend import RequestSender

logger = logging.getLogger(__name__)


class SendingMetricExporter(MetricExporter):
    """Cumulative points sent by ``sender`` (with the temporality and aggregation
    preferences of the SDK exporter ``like``, which the same ``OTEL_*`` variables
    configured), counted in ``health``."""

    def __init__(self, like: MetricExporter, sender: RequestSender, health: ExportHealth):
        super().__init__(
            preferred_temporality=getattr(like, "_preferred_temporality", None),
            preferred_aggregation=getattr(like, "_preferred_aggregation", None),
        )
        self.sender = sender
        self.health = health
        self.encoding = MetricEncoding()
        self._closed = threading.Event()

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
               **kwargs: object) -> MetricExportResult:
        points = count_points(metrics_data)
        if self._closed.is_set():
            return MetricExportResult.FAILURE
        try:
            payload = self.encoding.request(metrics_data)
        except Exception:
            logger.exception("dask_otel_spans: cannot encode a batch of metrics; "
                             "dropped (counted as failed)")
            self.health.record(False, points)
            return MetricExportResult.FAILURE
        # (within the exporter's timeout, as the SDK's exporter tries again: the
        # reader's last export at shutdown gives its interval, a minute)
        deadline = time.monotonic() + min(timeout_millis / 1000, self.sender.timeout)
        attempt = 0
        while True:
            try:
                reply = self.sender.send(payload)
            except Exception:  # (a sender closed under it at shutdown, say)
                logger.debug("dask_otel_spans: a metric export failed", exc_info=True)
                self.health.record(False, points)
                return MetricExportResult.FAILURE
            if reply.delivered:
                self.health.record(True, points)
                return MetricExportResult.SUCCESS
            attempt += 1
            delay = (min(reply.retry_after, RETRY_HINT_MAX)
                     if reply.retry_after is not None else backoff(attempt))
            if (not reply.retryable or time.monotonic() + delay > deadline
                    or self._closed.wait(delay)):
                self.health.record(False, points)
                return MetricExportResult.FAILURE

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True  # (an export sends before it returns)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: object) -> None:
        self._closed.set()
        self.sender.close()

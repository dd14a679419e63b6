"""Export health: count what a collector outage dropped, say so once per outage (and
once on recovery), and keep the OpenTelemetry SDK's per-batch log lines from flooding
the scheduler's log."""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics.export import MetricsData
    from opentelemetry.sdk.trace import ReadableSpan

logger = logging.getLogger(__name__)

#: Loggers of the SDK and exporters that log once per failed batch or dropped item
NOISY_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.exporter.otlp.proto.http._common",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
    "opentelemetry.exporter.otlp.common.http",
    "opentelemetry.sdk._shared_internal",
    "opentelemetry.sdk.trace.export",
    "opentelemetry.sdk.metrics._internal.export",
)


#: What a holding exporter does with what it could not deliver, said at an outage
HOLDING = ("holding them and sending them again, oldest first, once it answers "
           "(otel-spans.spool.*: in memory, then on disk; logged again on recovery)")


class ExportHealth:
    """Outage bookkeeping of one signal's exporter (thread-safe).

    Parameters
    ----------
    signal, where:
        The signal, and where its exporter sends it (for the log lines)
    holding:
        What is done with what a holding exporter could not deliver, said once per
        outage
    process:
        The process whose exporter it is, where the log lines must say it (a
        worker's: ``worker 0 (tcp://10.0.0.5:40123)``), once at the start of each;
        empty for the scheduler's export
    """

    def __init__(self, signal: str, where: str, holding: str = HOLDING,
                 process: str = ""):
        self.signal = signal
        self.where = where
        self.holding = holding
        self.process = process
        #: what each line starts with
        self._by = f"dask_otel_spans: {process}: " if process else "dask_otel_spans: "
        #: items the exporter reported delivered (at once, or held and sent again)
        self.delivered = 0
        #: items the exporter failed to deliver and nothing holds (dropped)
        self.failed = 0
        self.failed_batches = 0
        self.down = False
        #: outages of a holding exporter so far (said once each)
        self.outages = 0
        self._dropped_in_outage = 0
        self._holding = False
        #: whether this outage's first resend (:meth:`resend`) was said
        self._resend_said = False
        self._lock = threading.Lock()

    def record(self, ok: bool, items: int, dropped: int | None = None,
               waiting: int = 0) -> None:
        """A batch of ``items`` was delivered (``ok``) or failed and is dropped. For
        the recovery line of a holding exporter: ``dropped``, items the spool dropped
        so far; ``waiting``, items still held."""
        with self._lock:
            if ok:
                self.delivered += items
                if not self.down:
                    return
                self.down = False
                self._resend_said = False
                lost, self._dropped_in_outage = self._dropped_in_outage, 0
                held = self._holding
            else:
                self.failed += items
                self.failed_batches += 1
                self._dropped_in_outage += items
                if self.down:
                    return
                self.down = True
        if ok and held:
            logger.warning(
                "%s%s export to %s recovered; sending the %d %s still "
                "held, oldest first (%d dropped past the spool's bounds so far)",
                self._by, self.signal, self.where, waiting, self._unit(), dropped or 0,
            )
        elif ok:
            logger.warning(
                "%s%s export to %s recovered; %d %s were dropped "
                "during the outage (%d in total so far)",
                self._by, self.signal, self.where, lost, self._unit(), self.failed,
            )
        else:
            logger.error(
                "%scannot export %s to %s; dropping them until it "
                "recovers (counted; logged again on recovery)",
                self._by, self._unit(), self.where,
            )

    def outage(self) -> None:
        """A holding exporter's batch was not delivered and is held, to be sent
        again: said once per outage."""
        with self._lock:
            self._holding = True
            if self.down:
                return
            self.down = True
            self.outages += 1
        logger.error("%scannot export %s to %s; %s", self._by, self._unit(),
                     self.where, self.holding)

    def unencodable(self, items: int) -> None:
        """``items`` that could not be encoded were dropped before delivery: counted
        as failed, not an outage (the exporter says it)."""
        with self._lock:
            self.failed += items

    def resend(self, timeout: float) -> None:
        """A held batch whose last attempt went out and got no answer
        (within ``timeout`` seconds, or the connection was lost) is sent again: the
        backend may get those items twice. Said once per outage."""
        with self._lock:
            if self._resend_said:
                return
            self._resend_said = True
        logger.warning(
            "%s%s sent to %s got no answer within its %g s timeout (or "
            "lost the connection first); sending them again: the backend may have "
            "taken them already and get some twice (at least once, as every OTLP "
            "exporter; ExportState.resent counts them; said once per outage)",
            self._by, self._unit(), self.where, timeout)

    def refuse(self, items: int, reason: str) -> None:
        """A held batch of ``items`` was refused for good (not worth another try):
        counted as failed, said once per outage."""
        with self._lock:
            self.failed += items
            self.failed_batches += 1
            first = self._dropped_in_outage == 0
            self._dropped_in_outage += items
        if first:
            logger.error("%s%s refused %s for good (%s); dropped and "
                         "counted as failed", self._by, self.where, self._unit(), reason)

    def _unit(self) -> str:
        return {"traces": "spans", "logs": "log records"}.get(self.signal, "metric points")


class HealthSpanExporter(SpanExporter):
    """Wraps a span exporter: counts delivered and failed spans in ``health``."""

    def __init__(self, inner: SpanExporter, health: ExportHealth):
        self.inner = inner
        self.health = health

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self.inner.export(spans)
        except Exception:
            result = SpanExportResult.FAILURE
        self.health.record(result == SpanExportResult.SUCCESS, len(spans))
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


def count_points(metrics_data: MetricsData) -> int:
    """The data points of an SDK ``MetricsData``."""
    n = 0
    for rm in getattr(metrics_data, "resource_metrics", ()):
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                n += len(getattr(m.data, "data_points", ()))
    return n


class HealthMetricExporter(MetricExporter):
    """Wraps a metric exporter (same temporality and aggregation preferences)."""

    def __init__(self, inner: MetricExporter, health: ExportHealth):
        super().__init__(
            preferred_temporality=getattr(inner, "_preferred_temporality", None),
            preferred_aggregation=getattr(inner, "_preferred_aggregation", None),
        )
        self.inner = inner
        self.health = health

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
               **kwargs: object) -> MetricExportResult:
        try:
            result = self.inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)
        except Exception:
            result = MetricExportResult.FAILURE
        self.health.record(result == MetricExportResult.SUCCESS, count_points(metrics_data))
        return result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: object) -> None:
        self.inner.shutdown(timeout_millis=timeout_millis, **kwargs)


class RateLimitFilter(logging.Filter):
    """At most one record per logger and message template per ``interval`` seconds;
    the next one let through says how many were suppressed."""

    def __init__(self, interval: float = 300.0):
        super().__init__()
        self.interval = interval
        self._last: dict[tuple[str, str], float] = {}
        self._suppressed: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg))
        now = time.monotonic()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.interval:
                self._suppressed[key] = self._suppressed.get(key, 0) + 1
                return False
            self._last[key] = now
            suppressed = self._suppressed.pop(key, 0)
        if suppressed:
            record.msg = f"{record.msg} ({suppressed} similar messages suppressed)"
        return True


_filter_lock = threading.Lock()
_filter_users = 0
_FILTER = RateLimitFilter()


def rate_limit_sdk_logs() -> Callable[[], None]:
    """Install the rate limit on the SDK's noisy loggers; returns its undo (counted,
    so that several plugins in one process share one filter)."""
    global _filter_users
    with _filter_lock:
        if _filter_users == 0:
            for name in NOISY_LOGGERS:
                logging.getLogger(name).addFilter(_FILTER)
        _filter_users += 1

    done = False

    def undo() -> None:
        global _filter_users
        nonlocal done
        with _filter_lock:
            if done:
                return
            done = True
            _filter_users -= 1
            if _filter_users == 0:
                for name in NOISY_LOGGERS:
                    logging.getLogger(name).removeFilter(_FILTER)

    return undo

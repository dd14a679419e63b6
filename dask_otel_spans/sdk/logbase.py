"""The SDK's log record exporter base and its result, under the names they have from
opentelemetry-sdk 1.39 (``LogExporter`` and ``LogExportResult`` before; the SDK's log
API is still underscored)."""
from __future__ import annotations

try:
    from opentelemetry.sdk._logs.export import LogRecordExporter, LogRecordExportResult
except ImportError:  # (opentelemetry-sdk < 1.39)
    from opentelemetry.sdk._logs.export import LogExporter as LogRecordExporter
    from opentelemetry.sdk._logs.export import (  # type: ignore[assignment]
        LogExportResult as LogRecordExportResult,
    )

__all__ = ["LogRecordExporter", "LogRecordExportResult"]

"""OTLP-JSON lines files as the embedded default (or the Collector's file exporter)
writes them, made by hand for the readers' tests: a traces line, an exception log
record's line, a metrics line."""
from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

TRACE = "0af7651916cd43dd8448eb211c80319c"


def _attributes(attrs: Mapping[str, object]) -> list[dict]:
    out = []
    for key, value in attrs.items():
        if isinstance(value, bool):
            encoded: dict = {"boolValue": value}
        elif isinstance(value, int):
            encoded = {"intValue": str(value)}
        elif isinstance(value, float):
            # (NaN and infinities as text, as protobuf's JSON mapping writes them)
            encoded = {"doubleValue": value if math.isfinite(value) else (
                "NaN" if value != value else "Infinity" if value > 0 else "-Infinity")}
        else:
            encoded = {"stringValue": str(value)}
        out.append({"key": key, "value": encoded})
    return out


def span(span_id: str, name: str, parent: str = "", start_ms: int = 0, end_ms: int = 100,
         attributes: Mapping[str, object] | None = None, erred: bool = False) -> dict:
    """An OTLP-JSON span of trace :data:`TRACE` (``erred``: an error status, no event:
    its exception is a log record's, as with ``OTEL_SEMCONV_EXCEPTION_SIGNAL_OPT_IN=logs``)."""
    out = {"traceId": TRACE, "spanId": span_id, "name": name,
           "startTimeUnixNano": str(start_ms * 10**6), "endTimeUnixNano": str(end_ms * 10**6),
           "attributes": _attributes(attributes or {})}
    if parent:
        out["parentSpanId"] = parent
    if erred:
        out["status"] = {"code": 2}
    return out


def traces_line(spans: Sequence[dict], resource: Mapping[str, object] | None = None) -> str:
    return json.dumps({"resourceSpans": [{
        "resource": {"attributes": _attributes(resource or {})},
        "scopeSpans": [{"scope": {"name": "test"}, "spans": list(spans)}]}]}) + "\n"


def exception_log_line(span_id: str, exception_type: str, message: str) -> str:
    """An exception log record (event name ``exception``) of span ``span_id``."""
    return json.dumps({"resourceLogs": [{"resource": {"attributes": []}, "scopeLogs": [{
        "logRecords": [{"eventName": "exception", "traceId": TRACE, "spanId": span_id,
                        "timeUnixNano": "1", "attributes": _attributes({
                            "exception.type": exception_type,
                            "exception.message": message})}]}]}]}) + "\n"


def metrics_line() -> str:
    return json.dumps({"resourceMetrics": [{"resource": {"attributes": []}, "scopeMetrics": [{
        "metrics": [{"name": "dask.span.activity.time", "unit": "s", "sum": {
            "dataPoints": [{"asDouble": 1.0, "timeUnixNano": "1"}]}}]}]}]}) + "\n"


def write(path: Path, *lines: str) -> Path:
    """``lines`` appended to ``path`` (its directories made)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.writelines(lines)
    return path

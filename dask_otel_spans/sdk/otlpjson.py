"""OTLP-JSON lines files, the embedded default: exporters that append one export
request per line (the OpenTelemetry Collector's file exporter format, which its
``otlpjsonfile`` receiver reads back), and readers for those files."""
from __future__ import annotations

import base64
import glob
import json
import logging
import os
import re
import sys
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, TypedDict, overload

from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    MetricExporter,
    MetricExportResult,
    MetricsData,
)
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from dask_otel_spans import names
from dask_otel_spans.sdk.logbase import LogRecordExporter, LogRecordExportResult
from dask_otel_spans.sdk.otlpjsonshapes import JSONValue
from dask_otel_spans.sdk.otlpspans import SpanJsonEncoding

if TYPE_CHECKING:
    from google.protobuf.message import Message
    from opentelemetry.sdk._logs import ReadableLogRecord

    from dask_otel_spans.sdk.otlpjsonshapes import (
        AnyValueJSON,
        ExportRequestJSON,
        KeyValueJSON,
    )

logger = logging.getLogger(__name__)

#: A span or log record as read back (:func:`read_spans`, :func:`read_log_records`):
#: its OTLP/JSON fields, and its attributes decoded. Its values stay untyped: the
#: readers of these records (:mod:`~dask_otel_spans.cli`,
#: :mod:`~dask_otel_spans.reports`) take plain dicts and index their values freely (a
#: TypedDict would not pass as their ``dict``)
Record: TypeAlias = "dict[str, Any]"

TRACES_FILE = "traces.jsonl"
METRICS_FILE = "metrics.jsonl"
#: Exception log events (``OTEL_SEMCONV_EXCEPTION_SIGNAL_OPT_IN``)
LOGS_FILE = "logs.jsonl"
#: Below the output directory: the directories of worker processes, and of other
#: processes whose file exporters the SDK's configurator built (clients, launchers)
WORKERS_DIR = "workers"
PROCESSES_DIR = "processes"
_ID_FIELDS = frozenset({"traceId", "spanId", "parentSpanId"})


@overload
def _hex_ids(obj: dict[str, JSONValue]) -> dict[str, JSONValue]: ...
@overload
def _hex_ids(obj: JSONValue) -> JSONValue: ...
def _hex_ids(obj: JSONValue) -> JSONValue:
    """OTLP/JSON writes trace and span ids as hex, not protobuf's base64."""
    if isinstance(obj, dict):
        return {
            k: (
                base64.b64decode(v).hex()
                if k in _ID_FIELDS and isinstance(v, str)
                else _hex_ids(v)
            )
            for k, v in obj.items()
        }
    if isinstance(obj, list):
        return [_hex_ids(v) for v in obj]
    return obj


def to_otlp_json(message: Message) -> dict[str, JSONValue]:
    """An OTLP protobuf request as OTLP/JSON (camelCase, integer enums, hex ids)."""
    return _hex_ids(MessageToDict(message, use_integers_for_enums=True))


#: This process's directory for the files of exporters built without a path (by
#: the SDK's configurator under ``opentelemetry-instrument``); None until placed
_process_place: str | None = None


def place_process_files(directory: str) -> None:
    """Where this process's file exporters built without a path write from now on
    (a worker's directory of its own below ``otel-spans.output-dir``). Files they
    have written already stay where they are."""
    global _process_place
    _process_place = directory


def process_files_dir() -> str:
    """The directory of this process's files from exporters built without a path:
    the place :func:`place_process_files` gave, else
    ``<otel-spans.output-dir>/processes/<program>-<pid>`` (no two processes append
    to one file)."""
    if _process_place is not None:
        return _process_place
    from dask_otel_spans.config import setting

    program = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return os.path.join(setting("output-dir"), PROCESSES_DIR,
                        f"{file_label(program, 'python')}-{os.getpid()}")


def file_label(text: object, fallback: str) -> str:
    """``text`` as a file name's part: letters, digits, ``_.-``, at most 64 of them
    (``fallback`` when nothing is left)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", str(text))[:64] or fallback


class _JsonLinesWriter:
    """Appends lines to ``path``; with ``path`` None, to ``file_name`` in
    :func:`process_files_dir` as it is at the first write."""

    def __init__(self, path: str | None, file_name: str = ""):
        self._path = None if path is None else os.path.abspath(path)
        self._file_name = file_name
        self._lock = threading.Lock()
        self._failed = False

    @property
    def path(self) -> str:
        if self._path is None:
            return os.path.abspath(os.path.join(process_files_dir(), self._file_name))
        return self._path

    def write(self, record: dict[str, JSONValue]) -> bool:
        line = json.dumps(record, separators=(",", ":")) + "\n"
        try:
            with self._lock:
                if self._path is None:
                    self._path = self.path
                os.makedirs(os.path.dirname(self.path), exist_ok=True)
                with open(self.path, "a", encoding="utf-8") as f:
                    f.write(line)
        except OSError as e:
            if not self._failed:
                self._failed = True
                logger.error("dask_otel_spans: cannot write %s: %s", self.path, e)
            return False
        return True


class OTLPJsonLinesSpanExporter(SpanExporter):
    """Span exporter appending one OTLP/JSON ``ExportTraceServiceRequest`` per line
    to ``path`` (default: ``traces.jsonl`` in :func:`process_files_dir`; the SDK's
    configurator builds it so for ``OTEL_TRACES_EXPORTER=otlp_json_file``)."""

    def __init__(self, path: str | None = None):
        self._writer = _JsonLinesWriter(path, TRACES_FILE)
        self._encoding = SpanJsonEncoding()

    @property
    def path(self) -> str:
        return self._writer.path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        ok = self._writer.write(self._encoding.request(spans))
        return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class OTLPJsonLinesLogExporter(LogRecordExporter):
    """Log record exporter appending one OTLP/JSON ``ExportLogsServiceRequest`` per
    line to ``path`` (default: ``logs.jsonl`` in :func:`process_files_dir`)."""

    def __init__(self, path: str | None = None):
        self._writer = _JsonLinesWriter(path, LOGS_FILE)

    @property
    def path(self) -> str:
        return self._writer.path

    def export(self, batch: Sequence[ReadableLogRecord]) -> LogRecordExportResult:
        ok = self._writer.write(to_otlp_json(encode_logs(batch)))
        return LogRecordExportResult.SUCCESS if ok else LogRecordExportResult.FAILURE

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class OTLPJsonLinesMetricExporter(MetricExporter):
    """Metric exporter appending one OTLP/JSON ``ExportMetricsServiceRequest`` per line
    (cumulative temporality) to ``path`` (default: ``metrics.jsonl`` in
    :func:`process_files_dir`)."""

    def __init__(self, path: str | None = None):
        super().__init__(
            preferred_temporality={
                cls: AggregationTemporality.CUMULATIVE
                for cls in _instrument_classes()
            }
        )
        self._writer = _JsonLinesWriter(path, METRICS_FILE)

    @property
    def path(self) -> str:
        return self._writer.path

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: object
    ) -> MetricExportResult:
        ok = self._writer.write(to_otlp_json(encode_metrics(metrics_data)))
        return MetricExportResult.SUCCESS if ok else MetricExportResult.FAILURE

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: object) -> None:
        pass


def _instrument_classes() -> list[type]:
    from opentelemetry.sdk.metrics import (
        Counter,
        Histogram,
        ObservableCounter,
        ObservableGauge,
        ObservableUpDownCounter,
        UpDownCounter,
    )

    return [
        Counter,
        UpDownCounter,
        Histogram,
        ObservableCounter,
        ObservableUpDownCounter,
        ObservableGauge,
    ]


# -- reading ---------------------------------------------------------------------------

class _PointValue(TypedDict, total=False):
    value: float | int
    #: histograms only
    count: int


class MetricPoint(_PointValue):
    """A point of :func:`read_metric_points` (histograms: ``value`` is the sum)."""

    name: str
    unit: str
    kind: str
    attributes: dict[str, JSONValue]
    time: int



def any_value(value: AnyValueJSON) -> JSONValue:
    """Decode an OTLP/JSON ``AnyValue``."""
    if "stringValue" in value:
        return value["stringValue"]
    if "boolValue" in value:
        return value["boolValue"]
    if "intValue" in value:
        return int(value["intValue"])
    if "doubleValue" in value:
        return float(value["doubleValue"])
    if "arrayValue" in value:
        return [any_value(v) for v in value["arrayValue"].get("values", [])]
    if "kvlistValue" in value:
        return attributes(value["kvlistValue"].get("values", []))
    return None


def attributes(kvs: list[KeyValueJSON]) -> dict[str, JSONValue]:
    """Decode an OTLP/JSON attribute list."""
    return {kv["key"]: any_value(kv.get("value", {})) for kv in kvs}


def _records(path: str) -> Iterator[ExportRequestJSON]:
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                logger.warning("%s:%d: not a JSON line, skipped", path, lineno)


def read_spans(path: str) -> list[Record]:
    """Flat list of the spans in an OTLP/JSON lines traces file.

    Each span is the OTLP/JSON span with ``attributes`` decoded to a dict, plus
    ``resource`` (decoded resource attributes).
    """
    return flatten_spans(_records(path))


def flatten_spans(records: Iterable[ExportRequestJSON]) -> list[Record]:
    """Flat list of the spans of OTLP/JSON trace export requests (see read_spans)."""
    out: list[Record] = []
    for record in records:
        for rs in record.get("resourceSpans", []):
            resource = attributes(rs.get("resource", {}).get("attributes", []))
            for ss in rs.get("scopeSpans", []):
                for span in ss.get("spans", []):
                    sp: Record = dict(span)
                    sp["attributes"] = attributes(sp.get("attributes", []))
                    sp["resource"] = resource
                    out.append(sp)
    return out


def read_metric_points(path: str) -> list[MetricPoint]:
    """Flat list of the sum and histogram points in an OTLP/JSON lines metrics file:
    ``{"name", "unit", "attributes", "value", "time"}`` (histograms: ``value`` is the
    sum, plus ``count``)."""
    out: list[MetricPoint] = []
    kind: Literal["sum", "gauge", "histogram"]
    for record in _records(path):
        for rm in record.get("resourceMetrics", []):
            for sm in rm.get("scopeMetrics", []):
                for metric in sm.get("metrics", []):
                    for kind in ("sum", "gauge", "histogram"):
                        data = metric.get(kind)
                        if not data:
                            continue
                        for dp in data.get("dataPoints", []):
                            point: MetricPoint = {
                                "name": metric["name"],
                                "unit": metric.get("unit", ""),
                                "kind": kind,
                                "attributes": attributes(dp.get("attributes", [])),
                                "time": int(dp.get("timeUnixNano", 0)),
                            }
                            if kind == "histogram":
                                point["value"] = float(dp.get("sum", 0.0))
                                point["count"] = int(dp.get("count", 0))
                            elif "asDouble" in dp:
                                point["value"] = float(dp["asDouble"])
                            else:
                                point["value"] = int(dp.get("asInt", 0))
                            out.append(point)
    return out


def latest_points(points: list[MetricPoint]) -> list[MetricPoint]:
    """Of cumulative points, the latest one per (name, attributes)."""
    latest: dict[tuple[str, tuple[tuple[str, str], ...]], MetricPoint] = {}
    for p in points:
        key = (p["name"], tuple(sorted((k, str(v)) for k, v in p["attributes"].items())))
        if key not in latest or p["time"] >= latest[key]["time"]:
            latest[key] = p
    return list(latest.values())


def read_log_records(path: str) -> list[Record]:
    """Every log record of an OTLP-JSON lines file, with ids in hex and its
    attributes as a plain dict (``attrs``)."""
    out = []
    for record in _records(path):
        for rl in record.get("resourceLogs", ()):
            for sl in rl.get("scopeLogs", ()):
                for log in sl.get("logRecords", ()):
                    out.append({**log, "attrs": attributes(log.get("attributes", []))})
    return out


def traces_files(path: str) -> list[str]:
    """The traces files of ``path``: the file itself, or in a directory the
    scheduler's and those of the processes below it (worker processes'
    ``workers/*/``, and ``processes/*/`` of those whose file exporters the SDK's
    configurator built)."""
    if not os.path.isdir(path):
        return [path]
    return [os.path.join(path, TRACES_FILE),
            *(f for below in (WORKERS_DIR, PROCESSES_DIR)
              for f in sorted(glob.glob(os.path.join(path, below, "*", TRACES_FILE))))]


def read_all_spans(paths: Sequence[str]) -> list[Record]:
    """The spans of every traces file of ``paths`` that exists."""
    return [span for path in paths if os.path.exists(path) for span in read_spans(path)]


def exception_logs(traces_paths: Sequence[str]
                   ) -> dict[tuple[str | None, str | None], dict[str, JSONValue]]:
    """``(trace id, span id) -> attributes`` of the exception log events (event name
    ``exception``) in the ``logs.jsonl`` beside each traces file of ``traces_paths``."""
    out = {}
    for path in traces_paths:
        logs = os.path.join(os.path.dirname(os.path.abspath(path)), LOGS_FILE)
        if not os.path.exists(logs):
            continue
        for record in read_log_records(logs):
            if record.get("eventName") == names.EXCEPTION_EVENT:
                out[record.get("traceId"), record.get("spanId")] = record["attrs"]
    return out

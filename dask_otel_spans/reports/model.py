"""What the report shows, worked out from OTLP-JSON spans (pure, no HTML): per trace
its rows in tree order (depth, kind, times relative to the trace's start, attributes,
the exception of an erred span, the activity breakdown of dask and prefix spans), task
spans past a bound folded into one row per prefix; and a summary."""
from __future__ import annotations

import math
import os
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal, TypeAlias, TypedDict, cast

from dask_otel_spans import names
from dask_otel_spans.reports.running import is_running, running_label
from dask_otel_spans.sdk.otlpjson import WORKERS_DIR
from dask_otel_spans.wording import counted

#: Task spans shown per prefix span; the others are folded into one row with a count
MAX_TASK_ROWS = 50
#: Slowest dask spans listed in the summary
SLOWEST = 5
#: The activities of dask's fine performance metrics in dask's own order (its
#: dashboard's); others follow by name
ACTIVITY_ORDER = (
    "thread-cpu", "thread-noncpu", "executor", "offload", "other", "memory-read",
    "disk-read", "disk-write", "compress", "decompress", "serialize", "deserialize",
    "gather-dep", "transfer", "network", "idle or other spans",
)
#: OTLP's status code of an erred span (as the JSON files write it: a number)
STATUS_ERROR = (2, "STATUS_CODE_ERROR")
DASK, PREFIX, TASK, CLIENT, IN_TASK, FOLDED = (
    "dask", "prefix", "task", "client", "in-task", "folded")

# -- the files' spans, as sdk.otlpjson.read_spans shapes them --------------------------

#: Decoded attributes (a span's, its resource's, a log record's): values as the JSON
#: has them, read where they are used
Attributes: TypeAlias = "dict[str, object]"
#: ``(trace id, span id)`` as a file spells them
SpanKey: TypeAlias = "tuple[str | None, str | None]"
#: The exception log events' attributes by span
#: (:func:`~dask_otel_spans.sdk.otlpjson.exception_logs`)
Logged: TypeAlias = "Mapping[SpanKey, Mapping[str, object]]"
_TimeField = Literal["startTimeUnixNano", "endTimeUnixNano"]


class AnyValue(TypedDict, total=False):
    """An OTLP-JSON ``AnyValue`` (the fields the report reads)."""

    stringValue: str


class KeyValue(TypedDict):
    """An OTLP-JSON attribute, not decoded (an event's)."""

    key: str
    value: AnyValue


class SpanEvent(TypedDict, total=False):
    name: str
    attributes: list[KeyValue]


class SpanStatus(TypedDict, total=False):
    code: int | str
    message: str


class FileSpan(TypedDict, total=False):
    """A span of an OTLP-JSON traces file with its ``attributes`` decoded and its
    ``resource``'s attributes (the fields the report reads)."""

    traceId: str
    spanId: str
    parentSpanId: str
    name: str
    startTimeUnixNano: int | str
    endTimeUnixNano: int | str
    attributes: Attributes
    resource: Attributes
    events: list[SpanEvent]
    status: SpanStatus
    #: the file it was read from (:func:`~dask_otel_spans.reports.sources.read_files`)
    file: str


class FileLogRecord(TypedDict, total=False):
    """A log record of an OTLP-JSON logs file with its attributes decoded
    (``attrs``; the fields the report reads)."""

    eventName: str
    traceId: str
    spanId: str
    timeUnixNano: int | str
    observedTimeUnixNano: int | str
    attrs: Attributes


# -- the report's data (plain JSON) -------------------------------------------------------


class SpanError(TypedDict):
    type: str
    message: str
    stacktrace: str


class _Row(TypedDict):
    id: str | None
    parent: str | None
    parent_elsewhere: str
    name: str
    kind: str
    depth: int
    start: float
    duration: float
    attrs: Attributes
    error: SpanError | None
    breakdown: list[tuple[str, float]]


class Row(_Row, total=False):
    """A row of a trace: a span, or the task spans folded into one."""

    running: str
    folded: int


class TraceData(TypedDict):
    trace_id: str
    start_ns: int
    duration: float
    name: str
    rows: list[Row]
    activity_scale: float


class SlowSpan(TypedDict):
    name: str
    duration: float
    trace_id: str
    id: str | None


class Summary(TypedDict):
    traces: int
    spans: int
    tasks: int
    erred: int
    slowest: list[SlowSpan]


class ReportData(TypedDict):
    """The report's data: :func:`build`'s."""

    traces: list[TraceData]
    summary: Summary


def kind_of(span: FileSpan, parent_kind: str | None = None) -> str:
    """What a span is: a dask span, a task prefix span, a task span, a span made in
    a task on a worker (:func:`from_a_worker`, or its parent is a prefix, task or
    in-task span), or a span of client code."""
    attrs = span.get("attributes") or {}
    if names.SPAN_ID in attrs:
        return DASK
    if names.TASK_KEY in attrs:
        return TASK
    if names.TASK_GROUP_COUNT in attrs or names.TASK_PREFIX in attrs:
        return PREFIX
    if from_a_worker(span) or parent_kind in (PREFIX, TASK, IN_TASK):
        return IN_TASK
    return CLIENT


def task_label(span: FileSpan) -> str:
    """How ``tree`` and the report name a task span: its name, the task prefix (as
    docs/data-contract.md names it: span names stay low-cardinality), then its key
    (``dask.task.key``), which tells the task that erred from its prefix's others:
    ``validate (_validate-bfbee69c...)``; the name alone when it is the key."""
    name = str(span.get("name", ""))
    key = (span.get("attributes") or {}).get(names.TASK_KEY)
    return name if key is None or str(key) == name else f"{name} ({key})"


def from_a_worker(span: FileSpan) -> bool:
    """Whether a span was exported by a worker process: its resource names a worker
    (the worker plugin's providers), or it was read from a worker's file of the
    embedded default (``workers/<name>-<pid>/traces.jsonl``: under
    ``opentelemetry-instrument`` the launcher's providers, whose resource names no
    worker, write there too). Under a bare submission, a span made in a task is the
    child of the caller's span: only this tells it from client code's."""
    if (span.get("resource") or {}).get(names.WORKER_ADDRESS):
        return True
    file = span.get("file")
    if not file:
        return False
    process_dir = os.path.dirname(os.path.abspath(file))
    return os.path.basename(os.path.dirname(process_dir)) == WORKERS_DIR


def breakdown(attrs: Mapping[str, object]) -> list[tuple[str, float]]:
    """The ``dask.metrics.<activity>.seconds`` roll-up of a span, in dask's order
    (activities with no time left out)."""
    prefix, suffix = names.METRICS_ATTRIBUTE_PREFIX, ".seconds"
    found = {}
    for key, value in attrs.items():
        if key.startswith(prefix) and key.endswith(suffix) and isinstance(
                value, (int, float)) and 0 < value < math.inf:
            found[key[len(prefix):-len(suffix)]] = float(value)
    order = {activity: i for i, activity in enumerate(ACTIVITY_ORDER)}
    return sorted(found.items(), key=lambda item: (order.get(item[0], len(order)),
                                                   item[0]))


def _error(span: FileSpan, logged: Logged) -> SpanError | None:
    """The exception of an erred span (its event, or its log event), else its
    status description; None when it did not err."""
    attrs = span.get("attributes") or {}
    fields: Mapping[str, object] | None = logged.get(
        (span.get("traceId"), span.get("spanId")))
    for event in span.get("events") or ():
        if event.get("name") == names.EXCEPTION_EVENT:
            fields = {a["key"]: a["value"].get("stringValue", "")
                      for a in event.get("attributes") or ()}
    status = span.get("status") or {}
    if fields is None and status.get("code") not in STATUS_ERROR:
        return None
    fields = fields or {}
    return {
        "type": str(fields.get(names.EXCEPTION_TYPE)
                    or attrs.get(names.ERROR_TYPE) or "error"),
        "message": str(fields.get(names.EXCEPTION_MESSAGE) or status.get("message") or ""),
        "stacktrace": str(fields.get(names.EXCEPTION_STACKTRACE) or ""),
    }


def _ns(span: FileSpan, field: _TimeField) -> int:
    return int(span.get(field) or 0)


def build(spans: Sequence[FileSpan], logged: Logged | None = None,
          max_task_rows: int = MAX_TASK_ROWS) -> ReportData:
    """The report's data (plain JSON) from OTLP-JSON spans (as
    :func:`~dask_otel_spans.sdk.otlpjson.read_spans` reads them) and the exception
    log events of ``logged`` (:func:`~dask_otel_spans.cli.exception_logs`)."""
    logged = logged or {}
    by_trace: dict[str, list[FileSpan]] = defaultdict(list)
    for span in spans:
        by_trace[str(span.get("traceId", ""))].append(span)
    traces = [_trace(trace_id, members, logged, max_task_rows)
              for trace_id, members in by_trace.items()]
    traces.sort(key=lambda t: t["start_ns"])
    return {"traces": traces, "summary": _summary(traces, len(spans))}


def _trace(trace_id: str, spans: Sequence[FileSpan], logged: Logged,
           max_task_rows: int) -> TraceData:
    ids = {s.get("spanId") for s in spans}
    children: dict[str | None, list[FileSpan]] = defaultdict(list)
    roots = []
    for span in spans:
        parent = span.get("parentSpanId")
        if parent and parent in ids:
            children[parent].append(span)
        else:
            roots.append(span)
    start = min(_ns(s, "startTimeUnixNano") for s in spans)
    end = max(_ns(s, "endTimeUnixNano") for s in spans)
    rows: list[Row] = []

    def add(span: FileSpan, depth: int, parent_kind: str | None) -> None:
        kind = kind_of(span, parent_kind)
        attrs = span.get("attributes") or {}
        parent = span.get("parentSpanId") or ""
        rows.append({
            "id": span.get("spanId"), "parent": parent,
            # (a root whose parent is elsewhere: e.g. the application's own span,
            # exported by another process to another backend)
            "parent_elsewhere": parent if parent and parent not in ids else "",
            "name": task_label(span) if kind == TASK else str(span.get("name", "")),
            "kind": kind, "depth": depth,
            "start": (_ns(span, "startTimeUnixNano") - start) / 1e6,
            "duration": max(0, _ns(span, "endTimeUnixNano")
                            - _ns(span, "startTimeUnixNano")) / 1e6,
            "attrs": {k: v for k, v in attrs.items()},
            "error": _error(span, logged),
            "breakdown": breakdown(attrs) if kind in (DASK, PREFIX) else [],
            # started, not ended (from the records of logs.jsonl): its last progress
            "running": running_label(attrs) if is_running(attrs) else "",
        })
        kids = sorted(children.get(span.get("spanId"), ()),
                      key=lambda k: _ns(k, "startTimeUnixNano"))
        tasks = [k for k in kids if kind_of(k) == TASK]
        # erred tasks first, then the slowest: what a reader looks for
        tasks.sort(key=lambda k: (_error(k, logged) is None,
                                  -(_ns(k, "endTimeUnixNano") - _ns(k, "startTimeUnixNano"))))
        shown = {id(k) for k in tasks[:max_task_rows]}
        for k in kids:
            if kind_of(k) != TASK or id(k) in shown:
                add(k, depth + 1, kind)
        if len(tasks) > max_task_rows:
            rows.append({"id": f"{span.get('spanId')}-folded", "parent": span.get("spanId"),
                         "parent_elsewhere": "",
                         "name": counted(len(tasks) - max_task_rows, "more task span",
                                         "more task spans"),
                         "kind": FOLDED, "depth": depth + 1, "start": 0.0,
                         "duration": 0.0, "attrs": {}, "error": None, "breakdown": [],
                         "folded": len(tasks) - max_task_rows})

    for root in sorted(roots, key=lambda r: _ns(r, "startTimeUnixNano")):
        add(root, 0, None)
    return {"trace_id": trace_id, "start_ns": start, "duration": (end - start) / 1e6,
            "name": str(roots[0].get("name", "")) if roots else "", "rows": rows,
            # the activity bars' common scale: the most activity seconds of a row
            "activity_scale": max((sum(v for _, v in r["breakdown"]) for r in rows),
                                  default=0.0)}


def _whole(value: object) -> int:
    """A count attribute (a number, or the string of one), 0 when unset or not a
    whole number (NaN, an infinity, other text)."""
    try:
        return int(cast("int | float | str", value or 0))
    except (TypeError, ValueError, OverflowError):
        return 0


def _summary(traces: Iterable[TraceData], n_spans: int) -> Summary:
    tasks = erred = 0
    dask_rows = []
    traces = list(traces)
    for trace in traces:
        ids_of_dask = {r["id"] for r in trace["rows"] if r["kind"] == DASK}
        for row in trace["rows"]:
            if row["kind"] != DASK:
                continue
            dask_rows.append((row, trace["trace_id"]))
            if row["parent"] not in ids_of_dask:  # (a tree's figures cover its children)
                tasks += _whole(row["attrs"].get(names.SPAN_TASK_COUNT, 0))
                erred += _whole(row["attrs"].get(names.SPAN_ERRED_COUNT, 0))
    slowest = sorted(dask_rows, key=lambda item: -item[0]["duration"])[:SLOWEST]
    return {
        "traces": len(traces), "spans": n_spans, "tasks": tasks, "erred": erred,
        "slowest": [{"name": r["name"], "duration": r["duration"], "trace_id": t,
                     "id": r["id"]} for r, t in slowest],
    }

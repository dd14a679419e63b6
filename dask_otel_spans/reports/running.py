"""Spans that started and have not ended yet, from the ``dask.span.started`` and
``dask.span.progress`` records of the ``logs.jsonl`` beside traces files: span-shaped
dicts (as :func:`~dask_otel_spans.sdk.otlpjson.read_spans` makes them) marked
``dask.span.state=running`` with their last progress, for ``tree`` and the report.
A span that arrived in the traces replaces them, and pending spans are folded into
the span they stand for (:func:`with_running`)."""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, cast

from dask_otel_spans import names
from dask_otel_spans.sdk.otlpjson import LOGS_FILE, read_log_records
from dask_otel_spans.wording import counted

if TYPE_CHECKING:
    from dask_otel_spans.reports.model import FileLogRecord, FileSpan, SpanKey

_LIVE_EVENTS = (names.SPAN_STARTED_EVENT, names.SPAN_PROGRESS_EVENT)


def running_spans(traces_paths: Sequence[str],
                  spans: Sequence[FileSpan]) -> list[FileSpan]:
    """The running spans of the records beside each of ``traces_paths`` that are
    not among ``spans`` (those exported): from its started record (start, parent)
    to its last progress record (its figures)."""
    exported = {(s.get("traceId"), s.get("spanId")) for s in spans}
    found: dict[SpanKey, FileSpan] = {}
    for path in traces_paths:
        logs = os.path.join(os.path.dirname(os.path.abspath(path)), LOGS_FILE)
        if not os.path.exists(logs):
            continue
        for record in cast("list[FileLogRecord]", read_log_records(logs)):
            event = record.get("eventName")
            key = (record.get("traceId"), record.get("spanId"))
            if event not in _LIVE_EVENTS or key in exported or not all(key):
                continue
            _absorb(found.setdefault(key, _empty(str(key[0]), str(key[1]))), event,
                    record)
    return [span for span in found.values() if names.SPAN_ID in span["attributes"]]


def with_running(traces_paths: Sequence[str],
                 spans: Sequence[FileSpan]) -> list[FileSpan]:
    """``spans`` as ``tree`` and the report show them: plus the running spans of the
    records beside ``traces_paths`` (:func:`running_spans`), less the pending spans
    (``live.pending-spans``) of a span shown; of a span not shown, its latest pending
    span stands in for it."""
    exported = [s for s in spans if not is_running(s.get("attributes") or {})]
    out = [*exported, *running_spans(traces_paths, exported)]
    shown = {(s.get("traceId"), s.get("spanId")) for s in out}
    latest: dict[SpanKey, FileSpan] = {}
    for pending in spans:
        if not is_running(pending.get("attributes") or {}):
            continue
        parent = (pending.get("traceId"), pending.get("parentSpanId"))
        kept = latest.get(parent)
        if parent not in shown and (kept is None or int(
                pending.get("startTimeUnixNano") or 0) >= int(
                kept.get("startTimeUnixNano") or 0)):
            latest[parent] = pending
    return out + list(latest.values())


def _empty(trace_id: str, span_id: str) -> FileSpan:
    return {"traceId": trace_id, "spanId": span_id, "parentSpanId": "", "name": "",
            "startTimeUnixNano": 0, "endTimeUnixNano": 0, "status": {},
            "resource": {}, "attributes": {names.SPAN_STATE: names.SPAN_STATE_RUNNING}}


def _absorb(span: FileSpan, event: str, record: FileLogRecord) -> None:
    attrs = record.get("attrs") or {}
    at = int(record.get("timeUnixNano") or record.get("observedTimeUnixNano") or 0)
    tags = attrs.get(names.SPAN_NAME) or []
    span["name"] = str(tags[-1]) if isinstance(tags, list) and tags else str(tags)
    if event == names.SPAN_STARTED_EVENT:
        span["startTimeUnixNano"] = at
        span["parentSpanId"] = str(attrs.get(names.SPAN_PARENT_SPAN_ID) or "")
        span["attributes"].update(attrs)
    elif at >= int(span["endTimeUnixNano"]):
        span["attributes"].update(attrs)
        elapsed = attrs.get(names.SPAN_ELAPSED)
        if not span["startTimeUnixNano"] and isinstance(elapsed, (int, float)):
            span["startTimeUnixNano"] = at - int(elapsed * 1e9)
    span["endTimeUnixNano"] = max(int(span["endTimeUnixNano"]), at,
                                  int(span["startTimeUnixNano"]))


def is_running(attributes: Mapping[str, object]) -> bool:
    return attributes.get(names.SPAN_STATE) == names.SPAN_STATE_RUNNING


def running_label(attributes: Mapping[str, object]) -> str:
    """``running 12m, 840/2000 tasks, 2 erred, 12 running`` (from the last progress
    record: tasks done of the total, erred, running now); from records without a
    total, ``running 12m, 840 tasks done, 2 erred, 3 groups running``; ``running``
    alone before the first."""
    elapsed = attributes.get(names.SPAN_ELAPSED)
    parts = [f"running {_duration(float(elapsed))}"
             if isinstance(elapsed, (int, float)) else "running"]
    total = attributes.get(names.SPAN_TASKS_TOTAL)
    if total and names.SPAN_TASKS_DONE in attributes:
        parts.append(f"{attributes[names.SPAN_TASKS_DONE]}/{total} tasks")
    elif names.SPAN_TASKS_DONE in attributes:
        parts.append(f"{counted(attributes[names.SPAN_TASKS_DONE], 'task')} done")
    if attributes.get(names.SPAN_TASKS_ERRED):
        parts.append(f"{attributes[names.SPAN_TASKS_ERRED]} erred")
    if total:
        if attributes.get(names.SPAN_TASKS_RUNNING):
            parts.append(f"{attributes[names.SPAN_TASKS_RUNNING]} running")
    elif attributes.get(names.SPAN_GROUPS_RUNNING):
        parts.append(f"{counted(attributes[names.SPAN_GROUPS_RUNNING], 'group')} running")
    return ", ".join(parts)


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds // 60:.0f}m"
    return f"{seconds // 3600:.0f}h {seconds % 3600 // 60:02.0f}m"

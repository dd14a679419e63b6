"""Running spans from the records of logs.jsonl: written by the live writer through the
embedded default's file exporter, read back as running spans, replaced by the span once
it is exported."""
from __future__ import annotations

from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor

from dask_otel_spans import names
from dask_otel_spans.cli import render_tree
from dask_otel_spans.export.live import LiveSpan, LiveWriter, progress_attributes
from dask_otel_spans.export.tracking.progress import Progress, TaskCounts
from dask_otel_spans.protocol.propagation import resolve_chain
from dask_otel_spans.reports.model import build
from dask_otel_spans.reports.running import running_label, running_spans
from dask_otel_spans.sdk.otlpjson import LOGS_FILE, OTLPJsonLinesLogExporter

ROOT_ID = "6f1c1e9e-3b0a-4f57-9a49-2f6d1c3f0a11"
CHILD_ID = "0d9a8e77-51c4-4c6b-8c3e-7a5b2d1e9f22"


def write_records(tmp_path, total: int = 2000) -> LiveSpan:
    """A started record and two progress records of the span ``fit`` (``total``: 0
    writes none, as before tasks by state were known)."""
    provider = LoggerProvider()
    provider.add_log_record_processor(SimpleLogRecordProcessor(
        OTLPJsonLinesLogExporter(str(tmp_path / LOGS_FILE))))
    writer = LiveWriter(provider, None)
    chain = (ROOT_ID, CHILD_ID)
    span = LiveSpan(("wf", "fit"), CHILD_ID, ROOT_ID, resolve_chain(chain, {}))
    writer.started(span, 1000.0)
    for elapsed, done in ((720.0, 500), (750.0, 840)):
        counts = TaskCounts(done=done, erred=2, groups_running=3, groups_done=4,
                            total=total, running=12, waiting=total - done - 14)
        attributes = progress_attributes(Progress(CHILD_ID, elapsed, counts), 0)
        if not total:
            for name in (names.SPAN_TASKS_TOTAL, names.SPAN_TASKS_RUNNING,
                         names.SPAN_TASKS_WAITING):
                del attributes[name]
        writer.progress(span, 1000.0 + elapsed, attributes, pending=False)
    provider.shutdown()
    return span


def test_a_started_span_is_shown_running_with_its_last_progress(tmp_path):
    span = write_records(tmp_path)
    [running] = running_spans([str(tmp_path / "traces.jsonl")], [])
    assert (running["traceId"], running["spanId"]) == (
        f"{span.ids.trace_id:032x}", f"{span.ids.span_id:016x}")
    assert running["parentSpanId"] == f"{span.ids.parent_span_id:016x}"
    assert running["name"] == "fit"
    assert running_label(running["attributes"]) == (
        "running 12m, 840/2000 tasks, 2 erred, 12 running")
    assert int(running["startTimeUnixNano"]) == 1000 * 10**9


def test_records_without_a_total_are_shown_with_the_groups_running(tmp_path):
    write_records(tmp_path, total=0)
    [running] = running_spans([str(tmp_path / "traces.jsonl")], [])
    assert running_label(running["attributes"]) == (
        "running 12m, 840 tasks done, 2 erred, 3 groups running")


def test_a_running_span_is_replaced_once_the_span_is_exported(tmp_path):
    write_records(tmp_path)
    [running] = running_spans([str(tmp_path / "traces.jsonl")], [])
    exported = {"traceId": running["traceId"], "spanId": running["spanId"]}
    assert running_spans([str(tmp_path / "traces.jsonl")], [exported]) == []


def test_tree_and_report_mark_the_running_span(tmp_path):
    write_records(tmp_path)
    spans = running_spans([str(tmp_path / "traces.jsonl")], [])
    assert "fit  [running 12m, 840/2000 tasks" in render_tree(spans)
    [row] = build(spans)["traces"][0]["rows"]
    assert row["running"].startswith("running 12m") and row["kind"] == "dask"


def test_progress_attributes_count_the_spans_not_reported():
    attrs = progress_attributes(Progress("x", 1.0, TaskCounts()), not_reported=7)
    assert attrs[names.LIVE_SPANS_NOT_REPORTED] == 7
    assert names.LIVE_SPANS_NOT_REPORTED not in progress_attributes(
        Progress("x", 1.0, TaskCounts()), not_reported=0)

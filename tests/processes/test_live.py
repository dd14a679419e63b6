"""A span visible while it runs, in real processes: ``dask scheduler --preload
dask_otel_spans`` (its export process) and a ``dask worker``, exporting OTLP/gRPC to a
real receiver and the embedded default's files. One workflow of a few seconds runs
once for the module (``live.after`` 0.5 s, ``live.interval`` 0.5 s, pending spans
on): three stages of 4 tasks, each task depending on one of the stage before,
submitted at once (so the scheduler knows its 12 tasks from the start); then a span
whose scheduler is killed; each test checks one behaviour of it."""
from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from typing import Any

import distributed
import pytest
from distributed import Client
from support.polling import wait_for
from support.processes import DaskProcesses, otlp_grpc_env

from dask_otel_spans import names, span
from dask_otel_spans.cli import main as cli_main
from dask_otel_spans.reports.report import Report
from dask_otel_spans.sdk.otlpjson import LOGS_FILE, read_log_records

INTERVAL = 0.5
#: The workflow span's grace period (export-delay): progress records that went on
#: past its end would go on until its hand-over, this long after the export side
#: learned of the end; six intervals, far more than that learning takes under load
GRACE = 3.0
STAGE = [0.25] * 4  # one worker, two threads: 0.5 s per stage


def load(x: float) -> float:
    time.sleep(x)
    return x


def fit(x: float) -> float:
    time.sleep(x)
    return x


def score(x: float) -> float:
    time.sleep(x)
    return x


def hang(x: float) -> float:
    time.sleep(x)
    return x


def attrs_of(record: Any) -> dict[str, Any]:
    out = {}
    for kv in record.attributes:
        value = kv.value
        kind = value.WhichOneof("value")
        out[kv.key] = ([v.string_value for v in value.array_value.values]
                       if kind == "array_value" else getattr(value, kind))
    return out


def records(receiver: Any, event: str, span_id: str) -> list[tuple[Any, dict]]:
    return [(r, a) for _, r in receiver.log_records() if r.event_name == event
            for a in (attrs_of(r),) if a.get(names.SPAN_ID) == span_id]


def notice_time(client: Client, span_id: str) -> float | None:
    """When the scheduler got the close notice of the block of ``span_id`` (its time
    in the scheduler's event log); None before."""
    for at, msg in client.get_events(names.EVENT_TOPIC):
        for notice in msg if isinstance(msg, (list, tuple)) else [msg]:
            if isinstance(notice, dict) and span_id in notice.get("ids", ()):
                return at
    return None


def dask_spans(receiver: Any, span_id: str) -> list[dict]:
    return [s for s in receiver.spans() if s["attributes"].get(names.SPAN_ID) == span_id
            and names.SPAN_STATE not in s["attributes"]]


@pytest.fixture(scope="module")
def run(module_otlp_receiver, tmp_path_factory) -> dict[str, Any]:
    receiver = module_otlp_receiver
    cwd = tmp_path_factory.mktemp("live")
    env = {
        **otlp_grpc_env(receiver),
        "OTEL_TRACES_EXPORTER": "otlp,otlp_json_file",
        "OTEL_LOGS_EXPORTER": "otlp,otlp_json_file",
        "OTEL_BLRP_SCHEDULE_DELAY": "100",
        "DASK_OTEL_SPANS__LIVE__AFTER": "0.5s",
        "DASK_OTEL_SPANS__LIVE__INTERVAL": f"{INTERVAL}s",
        "DASK_OTEL_SPANS__EXPORT_DELAY": f"{GRACE}s",
        "DASK_OTEL_SPANS__LIVE__PENDING_SPANS": "true",
    }
    procs = DaskProcesses(env, cwd=str(cwd))
    out: dict[str, Any] = {"receiver": receiver}
    try:
        client = Client(procs.address, timeout=60)
        try:
            client.wait_for_workers(1, timeout=60)
            with span("live-wf") as span_id:
                stage = client.map(load, STAGE, pure=False)
                scores = client.map(score, client.map(fit, stage, pure=False),
                                    pure=False)
                wait_for(lambda: records(receiver, names.SPAN_STARTED_EVENT, span_id),
                         timeout=30, interval=0.02)
                client.gather(stage)
                # mid-run: a progress record in the files, then a copy of them
                logs = cwd / "dask-otel-spans" / LOGS_FILE
                wait_for(lambda: logs.exists() and any(
                    r.get("eventName") == names.SPAN_PROGRESS_EVENT
                    and r["attrs"].get(names.SPAN_ID) == span_id
                    for r in read_log_records(str(logs))), timeout=30)
                out["snapshot"] = shutil.copytree(cwd / "dask-otel-spans",
                                                  cwd / "snapshot")
                client.gather(scores)
            out["span_id"] = span_id
            out["notice_at"] = wait_for(lambda: notice_time(client, span_id), timeout=30)
            wait_for(lambda: dask_spans(receiver, span_id), timeout=30)
            out["arrival"] = [(s["name"], s["attributes"].get(names.SPAN_STATE))
                              for s in receiver.spans()]
            # the scheduler killed mid-workflow (a plain dask span: its block's exit
            # says nothing to the scheduler)
            with distributed.span("killed") as killed_id:
                futures = client.map(hang, [30.0] * 2, pure=False)
                wait_for(lambda: records(receiver, names.SPAN_STARTED_EVENT,
                                         killed_id), timeout=30)
                for process in (procs.scheduler, *procs.workers):
                    process.kill()
                out["killed_id"] = killed_id
                out["killed"] = wait_for(lambda: dask_spans(receiver, killed_id),
                                         timeout=30)
                del futures
        finally:
            # (its scheduler is gone: the client closes without waiting for it, in
            # 0.1 s; now and then, under load, distributed's close of a client whose
            # scheduler was killed waits on past 30 s: not under test, it is left)
            with contextlib.suppress(asyncio.TimeoutError):
                client.close(timeout=5)
    finally:
        procs.stop()
    return out


def test_started_record_comes_first_while_the_span_runs(run):
    # (the fixture waited for it inside the block, before the span's tasks were
    # gathered: it came while the span ran; and before the span's first progress
    # record, due live.after (0.5 s) after its start and each interval after: one
    # pipeline, in order. In how many seconds is what the machine's load allows: the
    # export side's own timing, at most an interval, is tests/export's)
    ours = [(r.event_name, a) for _, r in run["receiver"].log_records()
            for a in (attrs_of(r),) if a.get(names.SPAN_ID) == run["span_id"]]
    kinds = [event for event, _ in ours]
    assert kinds[0] == names.SPAN_STARTED_EVENT
    assert kinds.count(names.SPAN_STARTED_EVENT) == 1
    assert names.SPAN_PROGRESS_EVENT in kinds[1:]


def test_started_record_has_the_ids_the_span_is_exported_with(run):
    [exported] = dask_spans(run["receiver"], run["span_id"])
    [(record, attrs)] = records(run["receiver"], names.SPAN_STARTED_EVENT,
                                run["span_id"])
    assert (record.trace_id.hex(), record.span_id.hex()) == (
        exported["traceId"], exported["spanId"])
    assert attrs[names.SPAN_NAME] == ["live-wf"]
    assert attrs.get(names.SPAN_PARENT_SPAN_ID, "") == exported.get("parentSpanId", "")


def progress_of(run: dict[str, Any]) -> list[tuple[Any, dict]]:
    """The progress records of the workflow's span, in time order."""
    return sorted(records(run["receiver"], names.SPAN_PROGRESS_EVENT, run["span_id"]),
                  key=lambda ra: ra[0].time_unix_nano)


def test_progress_done_counts_grow_to_the_span_task_count(run):
    [exported] = dask_spans(run["receiver"], run["span_id"])
    progress = progress_of(run)
    done = [a[names.SPAN_TASKS_DONE] for _, a in progress]
    assert len(done) >= 2 and done == sorted(done)
    assert done[-1] == exported["attributes"][names.SPAN_TASK_COUNT] == 12
    [trace_id] = {r.trace_id.hex() for r, _ in progress}
    assert trace_id == exported["traceId"]


def test_progress_total_is_the_span_task_count_from_the_first_record(run):
    [exported] = dask_spans(run["receiver"], run["span_id"])
    totals = [a[names.SPAN_TASKS_TOTAL] for _, a in progress_of(run)]
    assert set(totals) == {exported["attributes"][names.SPAN_TASK_COUNT]}


def test_progress_tasks_by_state_add_up_to_the_total(run):
    by_state = [(a[names.SPAN_TASKS_DONE] + a[names.SPAN_TASKS_ERRED]
                 + a[names.SPAN_TASKS_RUNNING] + a[names.SPAN_TASKS_WAITING],
                 a[names.SPAN_TASKS_TOTAL]) for _, a in progress_of(run)]
    assert all(tasks == total for tasks, total in by_state)


def test_no_progress_record_is_made_after_the_span_ended(run):
    [exported] = dask_spans(run["receiver"], run["span_id"])
    progress = records(run["receiver"], names.SPAN_PROGRESS_EVENT, run["span_id"])
    assert progress
    # (the span ends at the client's block exit; the export side learns it from the
    # close notice, through the scheduler, at its next tick, then the pipe: a few
    # tenths of a second, more on a loaded machine. Records made on past that would
    # go on through the grace period, until the hand-over)
    assert max(r.time_unix_nano for r, _ in progress) <= (
        run["notice_at"] + GRACE / 2) * 1e9


def test_pending_spans_arrive_before_the_span_and_none_after(run):
    arrival = [state for name, state in run["arrival"] if name == "live-wf"]
    assert arrival[-1] is None  # the span itself, last
    assert arrival.count(None) == 1 and len(arrival) >= 3
    [exported] = dask_spans(run["receiver"], run["span_id"])
    later = [s for s in run["receiver"].spans()
             if s["name"] == "live-wf"][len(arrival):]
    assert later == []  # (none came while the killed span ran, either)
    pending = [s for s in run["receiver"].spans()
               if s["attributes"].get(names.SPAN_STATE) == names.SPAN_STATE_RUNNING
               and s["attributes"].get(names.SPAN_ID) == run["span_id"]]
    assert {(s["traceId"], s["parentSpanId"]) for s in pending} == {
        (exported["traceId"], exported["spanId"])}
    assert exported["spanId"] not in {s["spanId"] for s in pending}
    assert all(s["startTimeUnixNano"] == s["endTimeUnixNano"] for s in pending)


def test_tree_shows_the_running_span_from_a_snapshot_taken_mid_run(run, capsys):
    assert cli_main(["tree", str(run["snapshot"])]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "live-wf" in x)
    assert "[running" in line and "/12 tasks" in line


def test_report_shows_the_running_span_from_a_snapshot_taken_mid_run(run):
    rows = [r for t in Report([str(run["snapshot"])]).data["traces"] for r in t["rows"]
            if r["name"] == "live-wf"]
    assert [r["running"].startswith("running") for r in rows] == [True]


def test_a_killed_scheduler_leaves_its_running_span_exported_incomplete(run):
    [killed] = run["killed"]
    assert killed["attributes"][names.SPAN_INCOMPLETE] is True
    [(record, _)] = records(run["receiver"], names.SPAN_STARTED_EVENT, run["killed_id"])
    assert (record.trace_id.hex(), record.span_id.hex()) == (
        killed["traceId"], killed["spanId"])

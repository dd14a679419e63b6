"""The console script: ``demo`` on the embedded default, ``tree`` on saved files."""
from __future__ import annotations

import importlib
import io
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import dask
import pytest
from distributed.comm.core import CommClosedError
from distributed.core import Status
from support import browser
from support.otlpfiles import (
    TRACE,
    exception_log_line,
    metrics_line,
    traces_line,
    write,
)
from support.otlpfiles import span as otlp_span
from support.paths import EXAMPLES
from support.processes import TEST_CPU_POLICY, free_port

from dask_otel_spans.cli import EXIT_OUTPUT_CLOSED, main, render_tree
from dask_otel_spans.demo import (
    HEARTBEAT_FAILED,
    VALIDATION_NOTICE,
    ClosingHeartbeatFilter,
    demo_output_dir,
    demo_settings,
    set_aside_earlier_run,
    show_run,
)
from dask_otel_spans.sdk.otlpjson import read_metric_points, read_spans


def run_demo(cwd) -> subprocess.CompletedProcess:
    """``dask-otel-spans demo`` in ``cwd``, on the embedded default (no OTEL_*); its
    stdout and stderr in one stream, in the order a terminal shows them."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
           **TEST_CPU_POLICY}
    proc = subprocess.run(
        [sys.executable, "-m", "dask_otel_spans.cli", "demo"],
        cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout
    return proc


#: The traces file of an earlier demo run (another scheduler), which the run sets aside
EARLIER_RUN = (
    '{"resourceSpans":[{"resource":{"attributes":[{"key":"dask.scheduler.address",'
    '"value":{"stringValue":"tcp://127.0.0.1:1"}}]},"scopeSpans":[{"spans":[{'
    '"traceId":"0af7651916cd43dd8448eb211c80319c","spanId":"b7ad6b7169203331",'
    '"name":"demo workflow","startTimeUnixNano":"1000000","endTimeUnixNano":"3000000",'
    '"attributes":[{"key":"dask.span.id","value":{"stringValue":"earlier"}}]}]}]}]}\n')


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """One demo run, in a directory whose files hold an earlier run already (the
    demo sets them aside)."""
    cwd = tmp_path_factory.mktemp("demo")
    (cwd / "dask-otel-spans").mkdir()
    (cwd / "dask-otel-spans" / "traces.jsonl").write_text(EARLIER_RUN)
    proc = run_demo(cwd)
    return cwd, proc.stdout


@pytest.mark.cluster  # (the demo: a LocalCluster of processes)
def test_demo_prints_the_span_tree(demo_run):
    _, output = demo_run
    for name in ("demo workflow", "array step", "dataframe step", "futures step",
                 "custom activity", "model fit", "· fit_model"):
        assert name in output
    assert "model-fit" in output  # the custom context_meter activity
    # the task that raised, with its exception, and the spans made in tasks (the
    # worker plugin), below the prefix span
    assert "ValueError: record 3: negative amount" in output
    assert output.count("check record") == 8 and "(in a task)" in output


@pytest.mark.cluster  # (the demo: a LocalCluster of processes)
def test_demo_announces_its_deliberate_failure_before_dask_logs_it(demo_run):
    _, output = demo_run
    # (dask's own block, from the worker: "distributed.worker - ERROR - Compute Failed";
    # a WARNING in older releases: 2024.1.0)
    blocks = [m.start() for m in re.finditer(r"(ERROR|WARNING) - Compute Failed", output)]
    assert len(blocks) == 1
    assert output.index(VALIDATION_NOTICE) < blocks[0]


@pytest.mark.cluster  # (the demo: a LocalCluster of processes)
def test_demo_writes_embedded_default_files_and_says_where(demo_run):
    cwd, output = demo_run
    traces = cwd / "dask-otel-spans" / "traces.jsonl"
    metrics = cwd / "dask-otel-spans" / "metrics.jsonl"
    assert f"traces to {traces}" in output
    names_ = {s["name"] for s in read_spans(str(traces))}
    assert {"demo workflow", "array step", "model fit"} <= names_
    points = read_metric_points(str(metrics))
    assert any(
        p["name"] == "dask.span.activity.time"
        and p["attributes"]["dask.activity"] == "model-fit"
        and p["attributes"]["dask.span.name"] == "demo workflow/custom activity/model fit"
        for p in points
    )
    assert any(p["name"] == "dask.span.activity.custom"
               and p["attributes"]["dask.unit"] == "rows" for p in points)


@pytest.mark.cluster  # (the demo: a LocalCluster of processes)
def test_tree_command_reads_saved_files(demo_run):
    cwd, _ = demo_run
    proc = subprocess.run(
        [sys.executable, "-m", "dask_otel_spans.cli", "tree", "dask-otel-spans"],
        cwd=cwd, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("trace ")
    assert lines[1].strip().startswith("demo workflow")
    assert any(line.startswith("    array step") for line in lines)


@pytest.mark.cluster  # (the demo: a LocalCluster of processes)
def test_the_demo_starts_a_new_output_and_says_where_the_earlier_run_went(demo_run):
    cwd, output = demo_run
    [kept] = (cwd / "dask-otel-spans" / "earlier-runs").iterdir()
    assert (kept / "traces.jsonl").read_text() == EARLIER_RUN
    assert f"The earlier run's files are now in {kept.relative_to(cwd)} " in output
    saved = read_spans(str(cwd / "dask-otel-spans" / "traces.jsonl"))
    assert len({s["traceId"] for s in saved if s["name"] == "demo workflow"}) == 1
    printed = output.splitlines()
    assert sum(line.startswith("trace ") for line in printed) == 1


@pytest.mark.cluster  # (the demo: a LocalCluster of processes)
def test_the_demo_prints_no_traceback(demo_run):
    # (dask's "Compute Failed" block says the failing task's as "Traceback: '...'")
    _, output = demo_run
    assert "Traceback (most recent call last)" not in output


class StandInWorker:
    """A worker's status, as the filter reads it."""

    def __init__(self, status):
        self.status = status


def worker_record(message: str, error: BaseException | None) -> logging.LogRecord:
    """A record of ``distributed.worker`` as ``logger.exception`` makes it."""
    exc_info = None
    if error is not None:
        try:
            raise error
        except BaseException:
            exc_info = sys.exc_info()
    return logging.LogRecord("distributed.worker", logging.ERROR, __file__, 1, message,
                             None, exc_info)


@pytest.mark.parametrize("status", [Status.closing, Status.closed])
def test_a_heartbeat_whose_connection_closed_as_its_worker_closes_is_quiet(status):
    record = worker_record(HEARTBEAT_FAILED, CommClosedError("Stream is closed"))
    assert not ClosingHeartbeatFilter(StandInWorker(status)).filter(record)


@pytest.mark.parametrize("status, message, error", [
    (Status.running, HEARTBEAT_FAILED, CommClosedError("Stream is closed")),
    (Status.closing, HEARTBEAT_FAILED, ValueError("not a connection's")),
    (Status.closing, "Compute Failed", CommClosedError("Stream is closed")),
])
def test_every_other_worker_record_is_said(status, message, error):
    record = worker_record(message, error)
    assert ClosingHeartbeatFilter(StandInWorker(status)).filter(record)


def test_an_earlier_runs_entries_are_set_aside_and_nothing_else(tmp_path):
    for name in ("traces.jsonl", "report.html", "notes.txt"):
        (tmp_path / name).write_text(name)
    (tmp_path / "workers" / "0-7").mkdir(parents=True)
    kept = set_aside_earlier_run(str(tmp_path))
    assert kept is not None and Path(kept).parent == tmp_path / "earlier-runs"
    assert sorted(p.name for p in Path(kept).iterdir()) == [
        "report.html", "traces.jsonl", "workers"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["earlier-runs", "notes.txt"]
    assert set_aside_earlier_run(str(tmp_path)) is None  # (nothing left to move)


def test_two_earlier_runs_of_one_second_are_kept_apart(tmp_path):
    kept = []
    for run in ("first", "second"):
        (tmp_path / "traces.jsonl").write_text(run)
        os.utime(tmp_path / "traces.jsonl", (1_000_000_000, 1_000_000_000))
        kept.append(set_aside_earlier_run(str(tmp_path)))
    assert kept[0] != kept[1]
    assert [Path(k, "traces.jsonl").read_text() for k in kept] == ["first", "second"]


def test_tree_of_missing_file_fails(tmp_path, capsys):
    assert main(["tree", str(tmp_path / "nope")]) == 1
    assert capsys.readouterr().err == f"no such file or directory: {tmp_path / 'nope'}\n"


def test_render_tree_nests_by_parent():
    spans = [
        {"traceId": "t", "spanId": "1", "name": "wf", "startTimeUnixNano": "0",
         "endTimeUnixNano": "2000000000",
         "attributes": {"dask.span.id": "x", "dask.span.task_count": 3,
                        "dask.metrics.thread-cpu.seconds": 1.5}},
        {"traceId": "t", "spanId": "2", "parentSpanId": "1", "name": "inc",
         "startTimeUnixNano": "0", "endTimeUnixNano": "1000000000",
         "attributes": {"dask.task.prefix": "inc", "dask.task_group.task_count": 3}},
    ]
    assert render_tree(spans).splitlines() == [
        "trace t",
        "  wf  2.000s  3 tasks  | thread-cpu 1.5s",
        "    · inc  1.000s  3 tasks",
    ]


def test_render_tree_shows_task_spans_and_spans_made_in_tasks():
    spans = [
        {"traceId": "t", "spanId": "2", "name": "inc", "startTimeUnixNano": "0",
         "endTimeUnixNano": "1000000000",
         "attributes": {"dask.task.prefix": "inc", "dask.task_group.task_count": 3,
                        "dask.task_spans.left_out": 1}},
        {"traceId": "t", "spanId": "3", "parentSpanId": "2", "name": "inc",
         "startTimeUnixNano": "0", "endTimeUnixNano": "500000000",
         "attributes": {"dask.task.prefix": "inc", "dask.task.key": "inc-1"},
         "events": [{"name": "exception", "attributes": [
             {"key": "exception.type", "value": {"stringValue": "KeyError"}},
             {"key": "exception.message", "value": {"stringValue": "'a'"}}]}]},
        {"traceId": "t", "spanId": "4", "parentSpanId": "2", "name": "GET",
         "startTimeUnixNano": "600000000", "endTimeUnixNano": "700000000",
         "attributes": {}, "resource": {"dask.worker.address": "tcp://w:1"}},
    ]
    assert render_tree(spans).splitlines() == [
        "trace t",
        "  · inc  1.000s  3 tasks  (+1 task span left out)",
        "    ✗ inc (inc-1)  0.500s  KeyError: 'a'",
        "    GET  0.100s  (in a task)",
    ]


def test_render_tree_counts_idle_time_among_the_top_activities():
    spans = [{"traceId": "t", "spanId": "1", "name": "wf", "startTimeUnixNano": "0",
              "endTimeUnixNano": "2000000000",
              "attributes": {"dask.span.id": "x", "dask.span.task_count": 1,
                             "dask.metrics.thread-cpu.seconds": 0.5,
                             "dask.metrics.idle or other spans.seconds": 1.5}}]
    assert render_tree(spans).splitlines()[1].endswith(
        "| idle or other spans 1.5s, thread-cpu 0.5s")


def test_the_tree_and_the_report_name_an_erred_task_alike_by_prefix_and_key():
    from dask_otel_spans.reports.model import build

    task = {"traceId": "t", "spanId": "1", "name": "validate", "startTimeUnixNano": "0",
            "endTimeUnixNano": "100000000", "status": {"code": 2},
            "attributes": {"dask.task.prefix": "validate",
                           "dask.task.key": "_validate-bfbee69c"}}
    [row] = build([task])["traces"][0]["rows"]
    [line] = render_tree([task]).splitlines()[1:]
    assert row["name"] == "validate (_validate-bfbee69c)"
    assert line.startswith(f"  ✗ {row['name']}  0.100s")


def test_render_tree_says_where_a_roots_parent_is_and_what_runs_in_tasks():
    """A dask span whose parent is the application's own span (in another file or
    backend); a span below a prefix span is made in a task whatever its resource."""
    spans = [
        {"traceId": "t", "spanId": "1", "parentSpanId": "00f067aa0ba902b7", "name": "wf",
         "startTimeUnixNano": "0", "endTimeUnixNano": "2000000000",
         "attributes": {"dask.span.id": "x", "dask.span.task_count": 1}},
        {"traceId": "t", "spanId": "2", "parentSpanId": "1", "name": "inc",
         "startTimeUnixNano": "0", "endTimeUnixNano": "1000000000",
         "attributes": {"dask.task.prefix": "inc", "dask.task_group.task_count": 1}},
        {"traceId": "t", "spanId": "3", "parentSpanId": "2", "name": "GET",
         "startTimeUnixNano": "0", "endTimeUnixNano": "100000000", "attributes": {}},
    ]
    assert render_tree(spans).splitlines() == [
        "trace t",
        "  wf  2.000s  1 task  (parent 00f067aa0ba902b7 elsewhere)",
        "    · inc  1.000s  1 task",
        "      GET  0.100s  (in a task)",
    ]


def test_render_tree_says_1_task_not_1_tasks():
    spans = [
        {"traceId": "t", "spanId": "1", "name": "wf", "startTimeUnixNano": "0",
         "endTimeUnixNano": "2000000000",
         "attributes": {"dask.span.id": "x", "dask.span.task_count": 1}},
        {"traceId": "t", "spanId": "2", "parentSpanId": "1", "name": "inc",
         "startTimeUnixNano": "0", "endTimeUnixNano": "1000000000",
         "attributes": {"dask.task.prefix": "inc", "dask.task_group.task_count": 1}},
    ]
    assert render_tree(spans).splitlines() == [
        "trace t",
        "  wf  2.000s  1 task",
        "    · inc  1.000s  1 task",
    ]


def run_code(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)


# (help, version and exit codes are main's: called here, no process of their own; the
# demo and tree runs above go through ``python -m dask_otel_spans.cli``)


def test_no_command_prints_the_help(capsys):
    assert main([]) == 2
    out, err = capsys.readouterr()
    assert "usage: dask-otel-spans" in out
    assert "demo" in out and "tree" in out and not err


def test_version_is_the_packages(capsys):
    import dask_otel_spans

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == (
        f"dask-otel-spans {dask_otel_spans.__version__}")


def test_every_demo_option_has_help_text(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")  # (argparse wraps help at the terminal's width)
    with pytest.raises(SystemExit) as exited:
        main(["demo", "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "worker processes of the LocalCluster" in out
    assert "directory of the embedded default exporter" in out


def demo_export_delay(*argument: str) -> float:
    """The export delay of the scheduler plugin the demo makes (``--export-delay``
    ``argument`` when given), as it reads it."""
    from dask_otel_spans import OTelSpansPlugin

    return OTelSpansPlugin(**demo_settings(*argument)).config.export_delay


@pytest.fixture
def no_user_config(monkeypatch):
    """No otel-spans setting from the environment or dask's config files."""
    for variable in [v for v in os.environ if v.startswith("DASK_")]:
        monkeypatch.delenv(variable)
    monkeypatch.setattr(dask.config, "paths", [])


def test_the_demo_takes_the_export_delay_the_user_set(no_user_config):
    with dask.config.set({"otel-spans.export-delay": "3s"}):
        assert demo_export_delay() == 3.0


def test_the_demos_export_delay_argument_wins_over_the_users_config(no_user_config):
    with dask.config.set({"otel-spans.export-delay": "3s"}):
        assert demo_export_delay("2s") == 2.0


def test_the_demo_writes_where_the_user_set_its_output_dir(tmp_path):
    with dask.config.set({"otel-spans.output-dir": str(tmp_path)}):
        assert demo_output_dir() == str(tmp_path)
        assert demo_output_dir("given") == "given"


def test_the_demo_has_its_own_export_delay_where_the_user_set_none(no_user_config):
    assert demo_export_delay() == 0.5


def test_an_environment_variable_naming_the_shipped_export_delay_is_the_users(
    no_user_config, monkeypatch
):
    # (dask's config cannot tell it from the shipped default: the demo's would win)
    monkeypatch.setenv("DASK_OTEL_SPANS__EXPORT_DELAY", "1s")
    assert demo_export_delay() == 1.0


def test_a_bad_export_delay_is_the_demos_one_error_line_as_a_schedulers(
    no_user_config, caplog
):
    with dask.config.set(dask.config.collect_env(
            {"DASK_OTEL_SPANS__EXPORT_DELAY": "banana"})):
        with caplog.at_level(logging.WARNING, logger="dask_otel_spans"):
            assert demo_export_delay() == 1.0  # (the shipped default)
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith("dask_otel_spans: otel-spans.export-delay cannot be "
                           "'banana'")


@pytest.mark.cluster  # (the command in a process of its own)
def test_demo_without_its_extra_says_which_extra_in_one_line_before_anything():
    # (numpy cannot be imported, as after a plain `pip install dask_otel_spans`)
    proc = run_code("import sys; sys.modules['numpy'] = None; "
                    "from dask_otel_spans.cli import main; sys.exit(main(['demo']))")
    assert proc.returncode == 1
    assert proc.stdout == ""  # nothing announced
    [line] = proc.stderr.strip().splitlines()
    assert "pip install 'dask_otel_spans[demo]'" in line and "numpy" in line


# -- the report of the demo's run, in a real browser ---------------------------------


@pytest.fixture(scope="module")
def report_in_browser(demo_run, tmp_path_factory):
    """The demo's report opened in headless Chromium (with the probe): its DOM."""
    cwd, _ = demo_run
    where = tmp_path_factory.mktemp("browser")
    return browser.dump_dom(browser.probed_copy(cwd / "dask-otel-spans" / "report.html",
                                                where))


def rows_of(dom: str) -> dict[str, dict[str, str]]:
    """``span id -> {depth, class, html}`` of the report's rows."""
    out = {}
    for match in re.finditer(r'<div id="row-([^"]+)" class="([^"]*)" data-id="[^"]*" '
                             r'data-depth="(\d+)"(.*?)</div>', dom, re.DOTALL):
        out[match.group(1)] = {"class": match.group(2), "depth": match.group(3),
                               "html": match.group(4)}
    return out


@pytest.mark.cluster  # (the demo; a browser)
def test_demo_writes_its_report_and_says_where(demo_run):
    cwd, output = demo_run
    report = cwd / "dask-otel-spans" / "report.html"
    assert f"Report (open it in a browser): {report}" in output
    assert not re.search(r'(src|href)="https?:', report.read_text())


@pytest.mark.cluster  # (the demo; a browser)
def test_the_report_renders_without_errors_or_network(report_in_browser):
    assert browser.body_attribute(report_in_browser, "data-rendered") == "1"
    assert json.loads(browser.body_attribute(report_in_browser, "data-probe-errors")) == []
    assert json.loads(browser.body_attribute(report_in_browser,
                                             "data-probe-resources")) == []


@pytest.mark.cluster  # (the demo; a browser)
def test_every_span_of_the_run_has_its_row_at_its_depth(demo_run, report_in_browser):
    cwd, _ = demo_run
    spans = read_spans(str(cwd / "dask-otel-spans" / "traces.jsonl"))
    for worker_file in (cwd / "dask-otel-spans" / "workers").glob("*/traces.jsonl"):
        spans += read_spans(str(worker_file))
    parent_of = {(s["traceId"], s["spanId"]): s.get("parentSpanId") for s in spans}

    def depth(trace_id: str, span_id: str) -> int:
        parent = parent_of[trace_id, span_id]
        return 0 if not parent or (trace_id, parent) not in parent_of \
            else 1 + depth(trace_id, parent)

    rows = rows_of(report_in_browser)
    # (the files collect every run in the directory; the report is the last run's)
    traces = {s["traceId"] for s in spans if s["spanId"] in rows}
    run = [s for s in spans if s["traceId"] in traces]
    assert len(run) >= 25 and set(rows) == {s["spanId"] for s in run}
    for s in run:
        assert rows[s["spanId"]]["depth"] == str(depth(s["traceId"], s["spanId"])), s["name"]


@pytest.mark.cluster  # (the demo; a browser)
def test_the_erred_task_shows_its_exception(report_in_browser):
    erred = [r for r in rows_of(report_in_browser).values()
             if "task" in r["class"].split() and "erred" in r["class"].split()]
    assert len(erred) == 1
    assert ('<span class="exception">ValueError: record 3: negative amount</span>'
            in erred[0]["html"])


@pytest.mark.cluster  # (the demo; a browser)
def test_the_breakdown_bars_are_as_wide_as_the_metrics_say(demo_run, report_in_browser):
    cwd, _ = demo_run
    spans = {s["spanId"]: s for s in read_spans(str(cwd / "dask-otel-spans" / "traces.jsonl"))}
    rows = rows_of(report_in_browser)

    def activity_seconds(span) -> float:
        return sum(v for k, v in span["attributes"].items() if k.startswith(
            "dask.metrics.") and k.endswith(".seconds") and v > 0)

    shown = [spans[i] for i, r in rows.items() if i in spans
             and {"dask", "prefix"} & set(r["class"].split())]
    scale = max(activity_seconds(s) for s in shown)  # (the demo's run is one trace)
    checked = 0
    for span_id, row in rows.items():
        if "dask" not in row["class"].split():
            continue
        attrs = spans[span_id]["attributes"]
        seconds = {k[len("dask.metrics."):-len(".seconds")]: v for k, v in attrs.items()
                   if k.startswith("dask.metrics.") and k.endswith(".seconds") and v > 0}
        bars = re.findall(r'<i data-activity="([^"]+)" data-seconds="[^"]+" '
                          r'title="([^"]+)" style="width: ?([\d.]+)%', row["html"])
        assert {activity for activity, _, _ in bars} == set(seconds)
        for activity, title, width in bars:
            # one scale for the trace: the bar's length is its seconds
            assert float(width) == pytest.approx(seconds[activity] / scale * 100, abs=1e-3)
            assert title.startswith(f"{activity}: {seconds[activity]:.3g}"[:len(activity) + 4])
            assert " % of this span" in title.replace("&#39;", "'")
        checked += 1
    assert checked >= 6


@pytest.mark.cluster  # (the demo; a browser)
def test_a_screenshot_of_the_report(demo_run, tmp_path):
    cwd, _ = demo_run
    shot = browser.screenshot(cwd / "dask-otel-spans" / "report.html", tmp_path / "r.png")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


def test_render_tree_marks_a_span_made_in_a_task_that_erred():
    spans = [
        {"traceId": "t", "spanId": "4", "name": "check record",
         "startTimeUnixNano": "0", "endTimeUnixNano": "100000000", "attributes": {},
         "resource": {"dask.worker.address": "tcp://w:1"},
         "status": {"code": 2, "message": "ValueError: record 3"},
         "events": [{"name": "exception", "attributes": [
             {"key": "exception.type", "value": {"stringValue": "ValueError"}},
             {"key": "exception.message", "value": {"stringValue": "record 3"}}]}]},
    ]
    assert render_tree(spans).splitlines() == [
        "trace t", "  ✗ check record  0.100s  (in a task)  ValueError: record 3"]


@pytest.mark.cluster  # (the demo; a browser)
def test_rows_of_spans_made_in_tasks_say_so(report_in_browser):
    in_task = [r for r in rows_of(report_in_browser).values()
               if "in-task" in r["class"].split()]
    assert in_task and all('<span class="tag">in a task</span>' in r["html"]
                           for r in in_task)


@pytest.mark.cluster  # (the demo; a browser)
def test_every_row_keeps_the_breakdown_column_so_the_bars_share_one_time_axis(
        report_in_browser):
    rows = rows_of(report_in_browser)
    without = [r for r in rows.values() if 'class="mix"' not in r["html"]]
    assert without and all('<span class="mix none"></span>' in r["html"] for r in without)


def test_the_demo_says_what_came_of_an_export_it_cannot_read_back(capsys):
    """A dead endpoint: the figures' words (none delivered, all held), not "went to",
    and a failure status."""
    from dask_otel_spans.demo import say_outcome
    from dask_otel_spans.state import ExportState

    state = ExportState(
        traces_to="OTLP grpc to http://127.0.0.1:9", metrics_to="nowhere",
        export_process=True, open=0, handed_over=6, traces_delivered=0,
        traces_failed=0, metrics_delivered=None, metrics_failed=None, flushed=False,
        held={"traces": 2}, spooled={"traces": 10}, spool="/tmp/spool")
    assert say_outcome(state) == 1
    out, err = capsys.readouterr()
    assert "traces to OTLP grpc to http://127.0.0.1:9: 0 spans delivered, 0 failed" in out
    assert "2 still held in memory" in out and "10 still held in the spool /tmp/spool" in out
    assert "went to" not in out and "Not everything was delivered" in err


# -- tree and report: their paths, a closed output ----------------------------------


def saved_run(directory: Path) -> Path:
    """The embedded default's directory of a small run: a dask span, a prefix span, a
    task span that erred (its exception a log record: exceptions go to logs)."""
    write(directory / "traces.jsonl", traces_line([
        otlp_span("d1", "etl", attributes={"dask.span.id": "x", "dask.span.task_count": 1}),
        otlp_span("p1", "validate", "d1", attributes={"dask.task.prefix": "validate",
                                                      "dask.task_group.task_count": 1}),
        otlp_span("t1", "validate", "p1", erred=True,
                  attributes={"dask.task.prefix": "validate", "dask.task.key": "validate-3"}),
    ], {"dask.scheduler.address": "tcp://127.0.0.1:8786"}))
    write(directory / "logs.jsonl",
          exception_log_line("t1", "ValueError", "record 3: negative amount"))
    return directory


class ClosedOutput(io.StringIO):
    """A standard output whose reader went away (``... | head``)."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_tree_into_a_closed_output_exits_quietly(tmp_path, capsys, monkeypatch):
    saved_run(tmp_path)
    monkeypatch.setattr(sys, "stdout", ClosedOutput())
    assert main(["tree", str(tmp_path)]) == EXIT_OUTPUT_CLOSED
    assert capsys.readouterr().err == ""


@pytest.mark.cluster  # (the command in a process of its own: its exit flushes stdout)
def test_tree_piped_into_a_reader_that_stops_leaves_no_traceback(tmp_path):
    saved_run(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "dask_otel_spans.cli", "tree", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # (before it writes: as `head` that has read its lines)
    _, err = proc.communicate(timeout=60)
    assert (proc.returncode, err) == (EXIT_OUTPUT_CLOSED, "")


def test_the_demos_tree_shows_the_message_of_an_exception_logged(tmp_path, capsys):
    """Exceptions to logs (``OTEL_SEMCONV_EXCEPTION_SIGNAL_OPT_IN=logs``): the demo's
    tree says the message, as ``tree`` does."""
    from dask_otel_spans.state import ExportState

    saved_run(tmp_path)
    state = ExportState(
        traces_to=str(tmp_path / "traces.jsonl"), metrics_to="nowhere",
        export_process=True, open=0, handed_over=1, traces_delivered=3, traces_failed=0,
        metrics_delivered=None, metrics_failed=None, flushed=True)
    assert show_run(state, "tcp://127.0.0.1:8786", set()) == 0
    out = capsys.readouterr().out
    assert "✗ validate (validate-3)  0.100s  ValueError: record 3: negative amount" in out
    assert main(["tree", str(tmp_path)]) == 0
    assert "✗ validate (validate-3)  0.100s  ValueError: record 3: negative amount" in (
        capsys.readouterr().out)


def test_the_quickstarts_tree_shows_the_message_of_an_exception_logged(
        tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    quickstart = importlib.import_module("quickstart")
    saved_run(tmp_path)
    quickstart.print_span_tree(str(tmp_path / "traces.jsonl"), TRACE)
    assert "ValueError: record 3: negative amount" in capsys.readouterr().out


def test_tree_reads_the_embedded_default_directory_by_default(tmp_path, capsys,
                                                               monkeypatch):
    saved_run(tmp_path / "dask-otel-spans")
    monkeypatch.chdir(tmp_path)
    assert main(["tree"]) == 0
    assert capsys.readouterr().out.splitlines()[1] == "  etl  0.100s  1 task"


def test_tree_takes_several_paths_as_report_does(tmp_path, capsys):
    write(tmp_path / "a.jsonl", traces_line([otlp_span("a1", "first")]))
    write(tmp_path / "b.jsonl", traces_line([otlp_span("b1", "second", start_ms=5)]))
    assert main(["tree", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == [
        "  first  0.100s  (client span)", "  second  0.095s  (client span)"]


def test_tree_and_report_say_the_same_of_a_directory_without_traces_file(tmp_path,
                                                                         capsys):
    (tmp_path / "coll").mkdir()
    assert main(["tree", str(tmp_path / "coll")]) == 1
    tree_says = capsys.readouterr().err
    assert main(["report", str(tmp_path / "coll"), "-o", str(tmp_path / "r.html")]) == 1
    assert capsys.readouterr().err == tree_says
    assert tree_says.startswith(f"no traces file in {tmp_path / 'coll'} (")
    assert not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("command", ["tree", "report"])
@pytest.mark.parametrize("name, line", [("metrics.jsonl", metrics_line()),
                                        ("logs.jsonl", exception_log_line("t1", "E", "m"))])
def test_a_file_of_another_signal_given_as_traces_is_one_error_line(
        command, name, line, tmp_path, capsys, monkeypatch):
    saved_run(tmp_path)
    write(tmp_path / name, line)
    monkeypatch.chdir(tmp_path)  # (report's -o default)
    assert main([command, str(tmp_path / name)]) == 1
    out, err = capsys.readouterr()
    [said] = err.splitlines()
    assert said.startswith(f"not a traces file: {tmp_path / name} holds ") and not out
    assert not (tmp_path / "report.html").exists()


@pytest.fixture
def left_spool(tmp_path, monkeypatch):
    """A spool left by an export that ended (one batch of traces), and no receiver
    where OTLP goes."""
    from dask_otel_spans.sdk.destination import destination_of
    from dask_otel_spans.sdk.spool import Spool

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "0.2")
    left = Spool(str(tmp_path), max_memory=0, max_disk=10**6)
    left.open()
    left.put(destination_of(os.environ, "traces"), b"\n\x00", 1)
    left.close()
    return tmp_path


def test_resend_does_not_suggest_running_resend(left_spool, capsys):
    """What is left is said without "or: dask-otel-spans resend DIR"."""
    assert main(["resend", str(left_spool), "--timeout", "0.5"]) == 1
    out = capsys.readouterr().out
    assert "1 still held in the spool" in out and "dask-otel-spans resend" not in out


def test_resend_says_an_outage_as_what_it_does_with_it(left_spool, caplog):
    """(Not the export process's "sending them again once it answers": resend tries
    until its timeout, and what is left stays in the spool.)"""
    assert main(["resend", str(left_spool), "--timeout", "0.5"]) == 1
    [said] = [r.getMessage() for r in caplog.records if "cannot export" in r.getMessage()]
    assert said.endswith(f"trying again for at most 0.5 s; what is not sent stays in "
                         f"the spool {left_spool}")


def test_tree_labels_a_bare_submissions_span_made_in_a_task_under_zero_code(tmp_path,
                                                                           capsys):
    """``opentelemetry-instrument`` with ``otlp_json_file``: the app writes
    ``processes/…``, the worker ``workers/…`` with the launcher's resource (no
    ``dask.worker.*``); the task's span is the child of the app's."""
    write(tmp_path / "processes" / "app-1" / "traces.jsonl",
          traces_line([otlp_span("c1", "request")], {"service.name": "app"}))
    write(tmp_path / "workers" / "w-2" / "traces.jsonl",
          traces_line([otlp_span("i1", "inner", "c1", 10, 10)],
                      {"service.name": "unknown_service:dask"}))
    assert main(["tree", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == [
        "  request  0.100s  (client span)", "    inner  0.000s  (in a task)"]


def test_report_to_a_dash_writes_the_page_to_standard_output(tmp_path, capsys,
                                                              monkeypatch):
    saved_run(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main(["report", str(tmp_path), "-o", "-"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("<!DOCTYPE html>") and "validate-3" in out
    assert not (tmp_path / "-").exists()


def test_tree_escapes_the_control_characters_of_what_the_files_hold(tmp_path, capsys):
    message = "bad\x1b[2J\x1b]0;owned\x07 row\r\noverwritten\x9b31m \u202eevil\x00 ✓ end"
    task = otlp_span("b7ad6b7169203332", "inc-\x1b[31m1", parent="b7ad6b7169203331",
                     attributes={"dask.task.key": "inc-\x1b[31m1"}, erred=True)
    task["events"] = [{"name": "exception", "attributes": [
        {"key": "exception.type", "value": {"stringValue": "ValueError"}},
        {"key": "exception.message", "value": {"stringValue": message}}]}]
    root = otlp_span("b7ad6b7169203331", "client\x1b[8m", end_ms=200)
    (tmp_path / "traces.jsonl").write_text(traces_line([root, task]))
    assert main(["tree", str(tmp_path / "traces.jsonl")]) == 0
    out = capsys.readouterr().out
    assert out.splitlines() == [
        f"trace {TRACE}",
        "  client\\x1b[8m  0.200s  (client span)",
        "    ✗ inc-\\x1b[31m1  0.100s  ValueError: bad\\x1b[2J\\x1b]0;owned\\x07 "
        "row\\r\\noverwritten\\x9b31m \\u202eevil\\x00 ✓ end",
    ]
    assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u202e]", out)

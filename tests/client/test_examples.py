"""The examples run as written, against a real scheduler with the plugin preloaded."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from distributed import Client
from support.paths import EXAMPLES
from support.polling import wait_for
from support.processes import TEST_CPU_POLICY, DaskProcesses, otlp_grpc_env
from support.receivers import OTLPReceiver

from dask_otel_spans import names
from dask_otel_spans.sdk.otlpjson import read_spans

#: every example runs a cluster: a LocalCluster of its own, or a real scheduler's
pytestmark = pytest.mark.cluster


def run_example(name: str, *args: str, cwd) -> str:
    """What the example printed (it must exit 0)."""
    return example_run(name, *args, cwd=cwd).stdout


def example_run(name: str, *args: str, cwd) -> subprocess.CompletedProcess:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
           **TEST_CPU_POLICY}
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.fixture(scope="module")
def remote(tmp_path_factory):
    receiver = OTLPReceiver().start()
    # (a grace period of 2 s: the examples check what heartbeats bring, custom
    # activities among them; 0.2 s lost some to a heartbeat late on a loaded machine)
    procs = DaskProcesses({**otlp_grpc_env(receiver), "DASK_OTEL_SPANS__EXPORT_DELAY": "2s"},
                          cwd=str(tmp_path_factory.mktemp("s")), workers=2)
    with Client(procs.address, timeout=60) as client:
        client.wait_for_workers(2, timeout=60)
    yield procs, receiver
    procs.stop()
    receiver.stop()


def spans_named(receiver, *wanted):
    def check():
        spans = {s["name"]: s for s in receiver.spans()}
        return spans if set(wanted) <= set(spans) else None

    return wait_for(check, timeout=30)


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory):
    """One run of the quickstart on a LocalCluster: its directory and what it printed."""
    tmp_path = tmp_path_factory.mktemp("quickstart")
    out = run_example("quickstart.py", "--output-dir", str(tmp_path / "out"), cwd=tmp_path)
    return tmp_path, out


def test_quickstart_writes_its_span_tree_and_says_where(quickstart):
    tmp_path, out = quickstart
    traces = tmp_path / "out" / "traces.jsonl"
    spans = {s["name"]: s for s in read_spans(str(traces))}
    assert spans["load"]["parentSpanId"] == spans["quickstart"]["spanId"]
    assert spans["reduce"]["parentSpanId"] == spans["quickstart"]["spanId"]
    assert spans["load"]["attributes"][names.SPAN_TASK_COUNT] == 16
    # what it prints is what the scheduler's plugin did, read from the client
    handed_over = int(re.search(r"dask spans handed over: (\d+)", out).group(1))
    assert handed_over == len([s for s in spans.values() if names.SPAN_ID in s["attributes"]])
    assert f"traces to {traces}: " in out
    assert f"metrics to {tmp_path / 'out' / 'metrics.jsonl'}: " in out


def test_quickstart_prints_the_span_tree_its_docstring_promises(quickstart):
    tmp_path, out = quickstart
    spans = read_spans(str(tmp_path / "out" / "traces.jsonl"))
    trace_id = {s["traceId"] for s in spans if s["name"] == "quickstart"}.pop()
    tree = out[out.index(f"trace {trace_id}"):].splitlines()
    assert tree[1].startswith("  quickstart  ")
    assert tree[2].startswith("    load  ") and "16 tasks" in tree[2]
    assert any(line.startswith("    reduce  ") for line in tree)


def test_quickstart_with_an_address_uses_that_scheduler_and_writes_nothing_here(
        remote, tmp_path):
    procs, receiver = remote
    out = run_example("quickstart.py", procs.address, cwd=tmp_path)
    assert list(tmp_path.iterdir()) == []  # (no "tcp:" folder, nor any other)
    assert "traces to OTLP grpc to " in out
    spans = spans_named(receiver, "quickstart", "load", "reduce")
    assert spans["load"]["parentSpanId"] == spans["quickstart"]["spanId"]


def test_quickstart_says_an_output_directory_is_not_an_address(tmp_path):
    proc = subprocess.run([sys.executable, str(EXAMPLES / "quickstart.py"), "out"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "'out' is not a scheduler address" in proc.stderr
    assert "--output-dir" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_remote_scheduler_with_preload(remote, tmp_path):
    procs, receiver = remote
    out = run_example("remote_scheduler.py", procs.address, cwd=tmp_path)
    assert out.startswith("done: nightly report")
    spans = spans_named(receiver, "nightly report", "load", "aggregate", "publish")
    root = spans["nightly report"]
    for child in ("load", "aggregate", "publish"):
        assert spans[child]["parentSpanId"] == root["spanId"]


def test_remote_scheduler_without_the_plugin_says_so_once(tmp_path):
    procs = DaskProcesses({}, cwd=str(tmp_path), scheduler_preload=False)
    try:
        run = example_run("remote_scheduler.py", procs.address, cwd=tmp_path)
    finally:
        procs.stop()
    assert run.stdout.startswith("done: nightly report")
    warnings = [line for line in run.stderr.splitlines()
                if "runs no dask_otel_spans plugin" in line]
    assert len(warnings) == 1, run.stderr
    assert procs.address in warnings[0] and "--preload dask_otel_spans" in warnings[0]


def test_multi_tenant_tags_filter_metrics(remote, tmp_path):
    procs, receiver = remote
    run_example("multi_tenant.py", procs.address, cwd=tmp_path)

    def tenants():
        names_ = {dict(a)[names.SPAN_NAME] for a in receiver.latest_sums(names.SPAN_ACTIVITY_TIME)}
        wanted = {"user=alice/dataset=sales/score", "user=bob/dataset=sales/score",
                  "user=alice/dataset=logs/score"}
        return wanted <= names_

    wait_for(tenants, timeout=30)
    alice_sales = sum(
        v for a, v in receiver.latest_sums(names.SPAN_ACTIVITY_TIME).items()
        if dict(a)[names.SPAN_NAME] == "user=alice/dataset=sales/score"
        and dict(a)[names.ACTIVITY] in ("thread-cpu", "thread-noncpu")
    )
    assert alice_sales == pytest.approx(10 * 0.02, abs=0.1)


def test_custom_activities(remote, tmp_path):
    procs, receiver = remote
    run_example("custom_activities.py", procs.address, cwd=tmp_path)
    spans = spans_named(receiver, "fit")
    attrs = spans["fit"]["attributes"]
    assert attrs["dask.metrics.model-fit.seconds"] == pytest.approx(8 * 0.03, abs=0.1)
    assert attrs["dask.metrics.load-features.seconds"] > 0
    assert attrs["dask.metrics.rows-scored.rows"] == 8 * 500

    def rows():
        return any(dict(a)[names.UNIT] == "rows" and v == 4000
                   for a, v in receiver.latest_sums(names.SPAN_ACTIVITY_CUSTOM).items())

    wait_for(rows, timeout=30)


def test_workflow_inside_an_existing_application_trace(remote, tmp_path):
    procs, receiver = remote
    out = run_example("existing_trace.py", procs.address, cwd=tmp_path)
    m = re.search(r"trace (\w{32}) parent (\w{16})", out)
    spans = spans_named(receiver, "request analytics")
    dask_span = spans["request analytics"]
    assert dask_span["traceId"] == m.group(1)
    assert dask_span["parentSpanId"] == m.group(2)
    # the application's own spans, on its console: one trace with the dask span
    app = dict(re.findall(r"application span '([^']+)': (trace \w+ span \w+ parent \w+)",
                          out))
    assert app["handle request"] == f"trace {m.group(1)} span {m.group(2)} parent none"
    assert app["store result"].startswith(f"trace {m.group(1)} ")
    assert app["store result"].endswith(f" parent {dask_span['spanId']}")

"""Faults in real processes (``dask scheduler --preload dask_otel_spans`` and ``dask
worker``): a worker killed inside a span; the scheduler shut down with a span open, or
with a collector it cannot reach."""
from __future__ import annotations

import os
import signal
import time
from datetime import datetime

import pytest
from distributed import Client
from distributed.utils_test import inc
from support.polling import wait_for
from support.processes import DaskProcesses, free_port, otlp_grpc_env

from dask_otel_spans import names, span
from dask_otel_spans.sdk.otlpjson import read_spans
from dask_otel_spans.transport.choice import CHILD_EXIT_MARGIN


def sleepy(x: float) -> float:
    time.sleep(x)
    return x


@pytest.fixture
def nanny_cluster(otlp_receiver, tmp_path):
    procs = DaskProcesses(otlp_grpc_env(otlp_receiver), cwd=str(tmp_path), nanny=True)
    yield procs
    procs.stop()


def test_worker_killed_inside_a_span(nanny_cluster, otlp_receiver):
    with Client(nanny_cluster.address, timeout=60) as client:
        client.wait_for_workers(1, timeout=60)
        with span("survives") as span_id:
            futures = client.map(sleepy, [0.5] * 4, pure=False)
            wait_for(lambda: client.processing() and any(client.processing().values()))
            [pid] = client.run(os.getpid).values()
            os.kill(pid, signal.SIGKILL)
            t_kill = time.time_ns()
            assert client.gather(futures) == [0.5] * 4
        spans = wait_for(
            lambda: [s for s in otlp_receiver.spans() if s["name"] == "survives"],
            timeout=60,
        )
        time.sleep(1.0)
    spans = [s for s in otlp_receiver.spans() if s["name"] == "survives"]
    assert len(spans) == 1
    [survives] = spans
    assert survives["attributes"][names.SPAN_ID] == span_id
    assert survives["attributes"][names.SPAN_TASK_COUNT] == 4
    assert int(survives["endTimeUnixNano"]) > t_kill
    ids = [s["spanId"] for s in otlp_receiver.spans()]
    assert len(ids) == len(set(ids))


def test_scheduler_shutdown_flushes_open_spans_as_incomplete(tmp_path):
    procs = DaskProcesses({}, cwd=str(tmp_path))  # embedded default: files in cwd
    try:
        with Client(procs.address, timeout=60) as client:
            client.wait_for_workers(1, timeout=60)
            with span("done before shutdown"):
                client.submit(inc, 1).result()
            block = span("open at shutdown")
            block.__enter__()
            future = client.submit(sleepy, 60, pure=False)
            wait_for(lambda: any(client.processing().values()))
            procs.scheduler.send_signal(signal.SIGTERM)
            procs.scheduler.wait(60)
            for worker in procs.workers:  # (not under test: it would wait for its
                worker.kill()             # scheduler to come back)
    finally:
        log = procs.stop()
    spans = {s["name"]: s for s in read_spans(str(tmp_path / "dask-otel-spans" / "traces.jsonl"))}
    open_ = spans["open at shutdown"]["attributes"]
    assert open_[names.SPAN_INCOMPLETE] is True
    assert open_[names.SPAN_CLOSE_REASON] == names.CLOSE_REASON_SHUTDOWN
    assert names.SPAN_INCOMPLETE not in spans["done before shutdown"]["attributes"]
    assert "Scheduler closing all comms" in log  # (its own close ran: every release says it)
    del future


@pytest.fixture(scope="module")
def closed_with_an_unreachable_collector(tmp_path_factory):
    """A real scheduler exporting to a closed port, closed (SIGTERM) after one span:
    its log."""
    port = free_port()  # (nothing listens there)
    procs = DaskProcesses(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
         "OTEL_EXPORTER_OTLP_INSECURE": "true"},
        cwd=str(tmp_path_factory.mktemp("unreachable")),
    )
    try:
        with Client(procs.address, timeout=60) as client:
            client.wait_for_workers(1, timeout=60)
            with span("never delivered"):
                client.submit(inc, 1, key="never-1").result()
            # the span is handed to the SDK (its exporter now retries)
            wait_for(lambda: client.run_on_scheduler(
                lambda dask_scheduler: dask_scheduler.plugins["otel-spans"]
                .handed_over_count) >= 1)
        procs.scheduler.send_signal(signal.SIGTERM)
        procs.scheduler.wait(60)
        for worker in procs.workers:
            worker.kill()
    finally:
        log = procs.stop()
    return log


def logged_at(log: str, text: str) -> datetime:
    """When the first line of ``log`` holding ``text`` was logged (its asctime)."""
    line = next(line for line in log.splitlines() if text in line)
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")


def test_shutdown_waits_for_an_unreachable_collector_a_bounded_time(
    closed_with_an_unreachable_collector
):
    log = closed_with_an_unreachable_collector
    # the export process gave up on the collector itself, after shutdown-timeout (3 s),
    # and exited: never killed for outstaying it (it took 8.6 s unbounded)
    assert "the exporters stopped at otel-spans.shutdown-timeout (3.0 s)" in log
    assert not [line for line in log.splitlines()
                if "the export process (pid" in line and "killed" in line]
    # (the scheduler's close, as its log says, from the signal: the process's own
    # exit after it, the interpreter's teardown, takes what the machine's load allows;
    # lines every supported distributed writes)
    closing = (logged_at(log, "End scheduler")
               - logged_at(log, "Received signal SIGTERM")).total_seconds()
    assert closing < 3.0 + CHILD_EXIT_MARGIN


def test_shutdown_says_in_one_line_what_it_could_not_deliver(
    closed_with_an_unreachable_collector
):
    log = closed_with_an_unreachable_collector
    lines = [line for line in log.splitlines() if "at close" in line]
    assert len(lines) == 1
    assert "traces to OTLP grpc to http://127.0.0.1:" in lines[0]
    # the figures' words: none delivered, the dask span and its prefix span held
    assert ": 0 spans delivered, 0 failed, 2 still held in the spool " in lines[0], lines[0]
    assert "dask-otel-spans resend " in lines[0]
    assert "not delivered: 0 spans" not in log


def test_the_scheduler_log_says_where_data_goes_at_start(
    closed_with_an_unreachable_collector
):
    log = closed_with_an_unreachable_collector
    [line] = [line for line in log.splitlines() if "dask_otel_spans: traces to" in line]
    assert "INFO" in line
    assert "traces to OTLP grpc to http://127.0.0.1:" in line
    assert "metrics to OTLP grpc to http://127.0.0.1:" in line
    assert "export process pid" in line

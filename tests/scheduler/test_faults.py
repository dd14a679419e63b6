"""Faults: a collector that is down, goes away and comes back, or is slow; a worker
killed inside a span; a client that disconnects inside a block; scheduler shutdown;
the plugin registered twice or late; ``client.restart()``."""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
import warnings

import pytest
from conftest import (
    DaskProcesses,
    MemoryProviders,
    OTLPReceiver,
    async_wait_for,
    free_port,
    otlp_grpc_env,
    wait_for,
)
from distributed import Client, wait
from distributed.utils_test import gen_cluster, inc, slowinc
from test_plugin import install, plugin_of

from dask_otel_spans import OTelSpansPlugin, names, span
from dask_otel_spans.sdk.otlpjson import read_spans

#: in-process receivers start server threads inside the cluster (not the plugin's)
RECEIVER_THREADS = {"threads": False}


def env_plugin(endpoint: str, timeout_s: int = 1) -> OTelSpansPlugin:
    """Exporting in the scheduler process, whose providers' health the tests read
    (the export process has its own: tests/test_export_process.py)."""
    return OTelSpansPlugin(
        environ={
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_EXPORTER_OTLP_INSECURE": "true",
            "OTEL_EXPORTER_OTLP_TIMEOUT": str(timeout_s),
            "OTEL_BSP_SCHEDULE_DELAY": "50",
            "OTEL_METRIC_EXPORT_INTERVAL": "200",
        },
        use_global_providers=False, export_process=False,
        export_delay=0.1, idle_timeout=1.0,
    )


def sleepy(x: float) -> float:
    time.sleep(x)
    return x


def test_collector_down_then_up_then_away_and_back(caplog):
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    state = {}

    @gen_cluster(client=True, clean_kwargs=RECEIVER_THREADS, timeout=120)
    async def run(c, s, a, b):
        plugin = env_plugin(endpoint)
        await c.register_plugin(plugin)
        [trace_health] = [h for h in plugin.transport.session.pipeline.providers.health if h.signal == "traces"]
        # 1. collector down from the start
        for i in range(3):
            with span(f"down-{i}"):
                assert await c.submit(inc, i, key=f"down-{i}") == i + 1
        await async_wait_for(lambda: trace_health.dropped >= 3, timeout=30)
        assert trace_health.down
        # 2. it comes up: later spans arrive
        receiver = OTLPReceiver(port=port).start()
        with span("after-recovery"):
            await c.submit(inc, 10, key="up-1")
        await async_wait_for(
            lambda: any(sp["name"] == "after-recovery" for sp in receiver.spans()),
            timeout=60,
        )
        # (the receiver holds the spans before its answer reaches the exporter)
        await async_wait_for(lambda: not trace_health.down, timeout=30)
        # 3. it goes away mid-workflow and comes back
        receiver.stop()
        with span("while-away"):
            await c.submit(inc, 20, key="away-1")
        await async_wait_for(lambda: trace_health.down, timeout=30)
        receiver = OTLPReceiver(port=port).start()
        with span("back-again"):
            await c.submit(inc, 30, key="back-1")
        await async_wait_for(
            lambda: any(sp["name"] == "back-again" for sp in receiver.spans()),
            timeout=60,
        )
        state["max_call"] = plugin.loop_stats.max_seconds
        state["dropped"] = trace_health.dropped
        await plugin.close()
        receiver.stop()

    with caplog.at_level(logging.WARNING):
        run()
    # one line per outage, one per recovery; the SDK's per-batch lines rate-limited
    assert caplog.text.count("cannot export spans") == 2
    assert caplog.text.count("export to") >= 2 and "recovered" in caplog.text
    assert state["dropped"] >= 4
    # export never ran on the event loop
    assert state["max_call"] < 0.5


def test_slow_collector_does_not_block_the_scheduler():
    receiver = OTLPReceiver(delay=2.0).start()
    state = {}
    try:
        @gen_cluster(client=True, clean_kwargs=RECEIVER_THREADS, timeout=120)
        async def run(c, s, a, b):
            plugin = env_plugin(receiver.endpoint, timeout_s=10)
            await c.register_plugin(plugin)
            t0 = time.monotonic()
            for i in range(5):
                with span(f"slow-{i}"):
                    await wait(c.map(inc, range(10), key=[f"s{i}-{j}" for j in range(10)]))
            state["workflow_s"] = time.monotonic() - t0
            await async_wait_for(lambda: len(receiver.spans()) >= 5, timeout=60)
            state["max_call"] = plugin.loop_stats.max_seconds
            await plugin.close()

        run()
    finally:
        receiver.stop()
    # 5 exports of 2 s each happened while the workflow ran: it did not wait for them
    assert state["workflow_s"] < 5.0
    assert state["max_call"] < 0.5
    assert {sp["name"] for sp in receiver.spans()} >= {f"slow-{i}" for i in range(5)}


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


@gen_cluster(client=True)
async def test_client_disconnecting_inside_a_block(c, s, a, b):
    memory = MemoryProviders()
    await install(c, memory)
    block = span("orphan")
    block.__enter__()
    try:
        async with Client(s.address, asynchronous=True, set_as_default=False) as c2:
            assert await c2.submit(inc, 1, key="task-1") == 2
        await async_wait_for(lambda: memory.by_name("orphan"))
    finally:
        block.__exit__(None, None, None)
    [orphan] = memory.by_name("orphan")
    assert orphan.attributes[names.SPAN_CLOSE_REASON] == names.CLOSE_REASON_CLIENT_GONE
    assert orphan.attributes[names.SPAN_TASK_COUNT] == 1
    await asyncio.sleep(0.5)
    assert len(memory.by_name("orphan")) == 1


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
    assert "Closing scheduler" in log
    del future


@gen_cluster(client=True)
async def test_registered_twice_hands_over_without_loss_or_duplicates(c, s, a, b):
    memory = MemoryProviders()
    first = await install(c, memory)
    with span("first"):
        await c.submit(inc, 1, key="inc-1")
    await async_wait_for(lambda: memory.by_name("first"))
    with span("across"):
        slow = c.submit(slowinc, 1, delay=1.0, key="slow-1")
        await async_wait_for(lambda: "slow-1" in s.tasks and s.tasks["slow-1"].state == "processing")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # distributed: "overwriting"
            second = await install(c, memory)
        await slow
    await async_wait_for(lambda: memory.by_name("across"))
    await asyncio.sleep(0.5)
    assert plugin_of(s) is second and first.transport is None
    assert first.transport is None and second.transport is not None
    assert len(memory.by_name("across")) == 1
    assert len(memory.by_name("first")) == 1
    assert s.extensions["spans"].heartbeat.__wrapped__.__self__ is s.extensions["spans"]


@gen_cluster(client=True)
async def test_registered_while_spans_already_exist(c, s, a, b):
    with span("early"):
        slow = c.submit(slowinc, 1, delay=1.0, key="slow-1")
        await async_wait_for(lambda: "slow-1" in s.tasks and s.tasks["slow-1"].state == "processing")
        memory = MemoryProviders()
        await install(c, memory)
        await slow
    await async_wait_for(lambda: memory.by_name("early"))
    [early] = memory.by_name("early")
    assert early.attributes[names.SPAN_TASK_COUNT] == 1


@gen_cluster(client=True, Worker=__import__("distributed").Nanny, timeout=120)
async def test_client_restart(c, s, a, b):
    memory = MemoryProviders()
    await install(c, memory)
    with span("before restart"):
        slow = c.submit(slowinc, 1, delay=30, key="slow-1")
        await async_wait_for(lambda: "slow-1" in s.tasks and s.tasks["slow-1"].state == "processing")
        await c.restart()
        del slow
    with span("after restart"):
        assert await c.submit(inc, 1, key="inc-1") == 2
    await async_wait_for(lambda: memory.by_name("before restart") and memory.by_name("after restart"), timeout=60)
    await asyncio.sleep(0.5)
    assert len(memory.by_name("before restart")) == 1
    assert len(memory.by_name("after restart")) == 1


@pytest.fixture(scope="module")
def closed_with_an_unreachable_collector(tmp_path_factory):
    """A real scheduler exporting to a closed port, closed (SIGTERM) after one span:
    its log and how long it took to exit."""
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
        t0 = time.monotonic()
        procs.scheduler.send_signal(signal.SIGTERM)
        procs.scheduler.wait(60)
        elapsed = time.monotonic() - t0
        for worker in procs.workers:
            worker.kill()
    finally:
        log = procs.stop()
    return log, elapsed


def test_shutdown_waits_for_an_unreachable_collector_a_bounded_time(
    closed_with_an_unreachable_collector
):
    _, elapsed = closed_with_an_unreachable_collector
    # shutdown-timeout (3 s) and the scheduler's own close; it took 8.6 s unbounded
    assert elapsed < 3.0 + 3.0


def test_shutdown_says_in_one_line_what_it_could_not_deliver(
    closed_with_an_unreachable_collector
):
    log, _ = closed_with_an_unreachable_collector
    lines = [line for line in log.splitlines() if "did not finish within" in line]
    assert len(lines) == 1
    assert "otel-spans.shutdown-timeout" in lines[0]
    assert "spans to OTLP grpc to http://127.0.0.1:" in lines[0]


def test_the_scheduler_log_says_where_data_goes_at_start(
    closed_with_an_unreachable_collector
):
    log, _ = closed_with_an_unreachable_collector
    [line] = [line for line in log.splitlines() if "dask_otel_spans: traces to" in line]
    assert "INFO" in line
    assert "traces to OTLP grpc to http://127.0.0.1:" in line
    assert "metrics to OTLP grpc to http://127.0.0.1:" in line
    assert "export process pid" in line

"""Faults on in-process clusters: a collector that is down, goes away and comes back,
or is slow; a client that disconnects inside a block; the plugin registered twice or
late; ``client.restart()``. (A worker killed inside a span and the scheduler's
shutdown, in real processes: processes/test_process_faults.py.)"""
from __future__ import annotations

import asyncio
import logging
import warnings

import pytest
from distributed import Client, Event, wait
from distributed.utils_test import gen_cluster, inc, slowinc
from support.plugin import install, plugin_of, wait_for_event
from support.polling import async_wait_for
from support.processes import free_port
from support.providers import MemoryProviders
from support.receivers import RECEIVER_THREADS, OTLPReceiver

from dask_otel_spans import OTelSpansPlugin, names, span


def env_plugin(endpoint: str, timeout_s: int = 1) -> OTelSpansPlugin:
    """Exporting in the scheduler process, whose providers' health the tests read
    (the export process has its own: transport/test_export_process.py)."""
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


@gen_cluster(client=True, clean_kwargs=RECEIVER_THREADS, timeout=120)
async def test_collector_down_then_up_then_away_and_back(c, s, a, b, caplog):
    caplog.set_level(logging.WARNING)
    port = free_port()
    plugin = env_plugin(f"http://127.0.0.1:{port}")
    await c.register_plugin(plugin)
    providers = plugin.transport.session.pipeline.providers
    [trace_health] = [h for h in providers.health if h.signal == "traces"]

    def held() -> int:
        return providers.delivery()["traces"].waiting

    # 1. collector down from the start: the spans are held
    for i in range(3):
        with span(f"down-{i}"):
            assert await c.submit(inc, i, key=f"down-{i}") == i + 1
    await async_wait_for(lambda: held() >= 3 and trace_health.down, timeout=30)
    assert trace_health.failed == 0
    # 2. it comes up: the held spans arrive, then the later ones
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
    first = receiver
    receiver = OTLPReceiver(port=port).start()
    with span("back-again"):
        await c.submit(inc, 30, key="back-1")
    await async_wait_for(
        lambda: any(sp["name"] == "back-again" for sp in receiver.spans()),
        timeout=60,
    )
    max_call = plugin.loop_stats.max_seconds
    await plugin.close()
    receiver.stop()
    # one line per outage, one per recovery; the SDK's per-batch lines rate-limited
    assert caplog.text.count("cannot export spans") == 2
    assert caplog.text.count("recovered") >= 2
    # nothing lost, nothing twice (a dask span each, and a prefix span per task
    # group: dask keeps one "down" group, in the first down- span) but for what
    # ExportState.resent counts: an answer later than the exporter's 1 s timeout,
    # which a loaded machine can make of a receiver's, is sent again
    received = first.spans() + receiver.spans()
    spans = list({sp["spanId"]: sp for sp in received}.values())
    assert len(received) - len(spans) <= providers.delivery()["traces"].resent
    names_ = [sp["name"] for sp in spans if names.SPAN_ID in sp["attributes"]]
    assert sorted(names_) == sorted(["down-0", "down-1", "down-2", "after-recovery",
                                     "while-away", "back-again"])
    assert len(spans) == 10
    assert trace_health.failed == 0
    # export, holding and sending again never ran on the event loop
    assert max_call < 0.5


@pytest.fixture
def slow_receiver() -> OTLPReceiver:
    """A collector that takes 2 s to answer each trace export."""
    receiver = OTLPReceiver(delay=2.0).start()
    yield receiver
    receiver.stop()


@gen_cluster(client=True, clean_kwargs=RECEIVER_THREADS, timeout=120)
async def test_slow_collector_does_not_block_the_scheduler(c, s, a, b, slow_receiver):
    plugin = env_plugin(slow_receiver.endpoint, timeout_s=10)
    await c.register_plugin(plugin)
    for i in range(5):
        with span(f"slow-{i}"):
            await wait(c.map(inc, range(10), key=[f"s{i}-{j}" for j in range(10)]))
    # (the five dask spans: their prefix spans come in the same requests, not always
    # all of them in the first five spans received)
    dask_spans = {f"slow-{i}" for i in range(5)}
    await async_wait_for(
        lambda: {sp["name"] for sp in slow_receiver.spans()} >= dask_spans, timeout=60)
    max_call = plugin.loop_stats.max_seconds
    await plugin.close()
    # no call of the plugin on the event loop waited for an answer of the collector
    # (2 s each); how long the workflow took is what the machine's load allowed
    assert max_call < 0.5


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


@gen_cluster(client=True)
async def test_registered_twice_hands_over_without_loss_or_duplicates(c, s, a, b):
    memory = MemoryProviders()
    first = await install(c, memory)
    with span("first"):
        await c.submit(inc, 1, key="inc-1")
    await async_wait_for(lambda: memory.by_name("first"))
    with span("across"):
        slow = c.submit(slowinc, 1, delay=1.0, key="slow-1")
        await async_wait_for(
            lambda: "slow-1" in s.tasks and s.tasks["slow-1"].state == "processing")
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
async def test_an_unregistered_plugin_closes_itself_and_exports_what_it_held(
    c, s, a, b, caplog
):
    caplog.set_level(logging.INFO, logger="dask_otel_spans")
    heartbeat_handler = s.handlers["heartbeat_worker"]
    memory = MemoryProviders()
    plugin = await install(c, memory)
    with span("before"):
        await c.submit(inc, 1, key="inc-1")
    with span("running"):
        running_task = c.submit(wait_for_event, "release-held", key="held-1")
        await async_wait_for(lambda: "held-1" in s.tasks
                             and s.tasks["held-1"].state == "processing")
        # (distributed removes the plugin from the scheduler, and does not close it)
        await c.unregister_scheduler_plugin(names.PLUGIN_NAME)
        await async_wait_for(lambda: plugin.transport is None)
        await Event("release-held").set()
        await running_task
    [running] = memory.by_name("running")
    assert running.attributes[names.SPAN_INCOMPLETE] is True
    assert len(memory.by_name("before")) == 1
    assert s.handlers["heartbeat_worker"] is heartbeat_handler
    assert f"{names.PLUGIN_NAME}-tick" not in s.periodic_callbacks
    assert caplog.text.count("the plugin was unregistered; closing it") == 1


@gen_cluster(client=True)
async def test_registered_while_spans_already_exist(c, s, a, b):
    with span("early"):
        slow = c.submit(slowinc, 1, delay=1.0, key="slow-1")
        await async_wait_for(
            lambda: "slow-1" in s.tasks and s.tasks["slow-1"].state == "processing")
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
        await async_wait_for(
            lambda: "slow-1" in s.tasks and s.tasks["slow-1"].state == "processing")
        await c.restart()
        del slow
    with span("after restart"):
        assert await c.submit(inc, 1, key="inc-1") == 2
    await async_wait_for(lambda: memory.by_name("before restart")
                         and memory.by_name("after restart"), timeout=60)
    await asyncio.sleep(0.5)
    assert len(memory.by_name("before restart")) == 1
    assert len(memory.by_name("after restart")) == 1

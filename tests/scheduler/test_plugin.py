"""The plugin's behaviour on in-process clusters (``gen_cluster``), exporting to memory."""
from __future__ import annotations

import asyncio
import logging
from time import time

import dask
import pytest
from distributed import Client, Event, default_client, wait
from distributed import span as dask_span
from distributed.utils_test import gen_cluster, inc, slowinc
from opentelemetry import trace
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    StatusCode,
    TraceFlags,
    TraceState,
)
from support.heartbeats import span_metrics_in
from support.plugin import install, plugin_of, tracker_of, wait_for_event
from support.polling import async_wait_for
from support.providers import MemoryProviders

from dask_otel_spans import names, span
from dask_otel_spans.client import ExportState, plugin_status
from dask_otel_spans.protocol.propagation import otel_span_id, otel_trace_id


@gen_cluster(client=True)
async def test_register_plugin_keeps_in_process_providers(c, s, a, b):
    memory = MemoryProviders()
    plugin = await install(c, memory)
    assert plugin_of(s) is plugin
    assert plugin.transport.session.pipeline.providers.tracer_provider is (
        memory.tracer_provider
    )
    assert plugin.transport.session.pipeline.providers.owned == []
    assert plugin.destinations["export_process"] is False


@gen_cluster(client=True)
async def test_nested_spans_become_one_trace_with_parent_chain(c, s, a, b):
    memory = MemoryProviders()
    await install(c, memory)
    with span("wf") as wf_id:
        with span("load") as load_id:
            await c.submit(inc, 1, key="inc-1")
    await async_wait_for(lambda: len(memory.dask_spans()) == 2)
    spans = {sp.name: sp for sp in memory.dask_spans()}
    wf, load = spans["wf"], spans["load"]
    assert wf.context.trace_id == load.context.trace_id == otel_trace_id(wf_id)
    assert wf.context.span_id == otel_span_id(wf_id)
    assert load.context.span_id == otel_span_id(load_id)
    assert wf.parent is None
    assert load.parent.span_id == wf.context.span_id
    assert load.attributes[names.SPAN_NAME] == ("wf", "load")
    assert load.attributes[names.SPAN_TASK_COUNT] == 1
    assert load.attributes[names.SPAN_CLOSE_REASON] == names.CLOSE_REASON_CLIENT


@gen_cluster(client=True)
async def test_client_otel_span_is_the_parent_and_inner_client_spans_nest(c, s, a, b):
    memory = MemoryProviders()
    await install(c, memory)
    tracer = memory.tracer_provider.get_tracer("app")
    with tracer.start_as_current_span("request") as request:
        with span("wf") as wf_id:
            await c.submit(inc, 1, key="inc-1")
            with tracer.start_as_current_span("http call") as http:
                pass
    await async_wait_for(lambda: memory.by_name("wf"))
    [wf] = memory.by_name("wf")
    ctx = request.get_span_context()
    assert wf.context.trace_id == ctx.trace_id
    assert wf.parent.span_id == ctx.span_id
    assert http.context.trace_id == ctx.trace_id
    assert http.parent.span_id == otel_span_id(wf_id) == wf.context.span_id


@gen_cluster(client=True)
async def test_a_nested_block_hangs_under_its_parent_in_the_clients_trace_and_state(
    c, s, a, b
):
    """The inner block carries no header of its own (its parent block's span was
    current): its parent, trace and trace state are derived from the chain and the
    root's carried context."""
    memory = MemoryProviders()
    await install(c, memory)
    client_ctx = SpanContext(
        trace_id=0x0AF7651916CD43DD8448EB211C80319C, span_id=0xB7AD6B7169203331,
        is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED),
        trace_state=TraceState([("vendor", "opaque")]),
    )
    with trace.use_span(NonRecordingSpan(client_ctx)):
        with span("wf") as wf_id:
            with span("load") as load_id:
                await c.submit(inc, 1, key="inc-1")
    await async_wait_for(lambda: len(memory.dask_spans()) == 2)
    spans = {sp.name: sp for sp in memory.dask_spans()}
    wf, load = spans["wf"], spans["load"]
    assert wf.context.trace_id == load.context.trace_id == client_ctx.trace_id
    assert wf.parent.span_id == client_ctx.span_id
    assert load.parent.span_id == wf.context.span_id == otel_span_id(wf_id)
    assert load.context.span_id == otel_span_id(load_id)
    assert load.context.trace_state == client_ctx.trace_state


@gen_cluster(client=True)
async def test_prefix_child_spans(c, s, a, b):
    memory = MemoryProviders()
    await install(c, memory)
    with span("wf"):
        x = c.map(inc, range(5))
        y = c.map(slowinc, x, delay=0.01)
        await wait(y)
    await async_wait_for(lambda: memory.by_name("wf"))
    [wf] = memory.by_name("wf")
    children = [sp for sp in memory.spans()
                if sp.parent and sp.parent.span_id == wf.context.span_id]
    by_name = {sp.name: sp for sp in children}
    assert set(by_name) == {"inc", "slowinc"}
    assert by_name["inc"].attributes[names.TASK_GROUP_TASK_COUNT] == 5
    assert by_name["slowinc"].attributes[names.TASK_PREFIX] == "slowinc"
    for child in children:
        assert wf.start_time <= child.start_time <= child.end_time <= wf.end_time


@gen_cluster(client=True)
async def test_several_computes_in_one_block_give_one_span(c, s, a, b):
    memory = MemoryProviders()
    plugin = await install(c, memory, export_delay=0.1, idle_timeout=0.5)
    with span("wf") as wf_id:
        await c.submit(inc, 1, key="inc-1")
        # longer than grace and idle timeout: without the close notice the span
        # would have been emitted after the first compute
        await asyncio.sleep(0.9)
        assert memory.by_name("wf") == []
        await c.submit(inc, 2, key="inc-2")
    await async_wait_for(lambda: memory.by_name("wf"))
    await asyncio.sleep(0.3)
    [wf] = memory.by_name("wf")
    assert wf.attributes[names.SPAN_TASK_COUNT] == 2
    ext = s.extensions["spans"]
    assert wf.end_time >= int(ext.spans[wf_id].stop * 1e9) - 1000
    assert plugin.open_span_count == 0


@gen_cluster(client=True)
async def test_plain_distributed_span_is_exported_after_idle_timeout(c, s, a, b):
    memory = MemoryProviders()
    await install(c, memory)
    with dask_span("plain") as plain_id:
        await c.submit(inc, 1, key="inc-1")
    await async_wait_for(lambda: memory.by_name("plain"))
    [plain] = memory.by_name("plain")
    assert plain.context.trace_id == otel_trace_id(plain_id)
    assert plain.attributes[names.SPAN_CLOSE_REASON] == names.CLOSE_REASON_IDLE
    done_at = s.extensions["spans"].spans[plain_id].stop
    assert plain.end_time == pytest.approx(done_at * 1e9, abs=1e3)


@gen_cluster(client=True)
async def test_default_span_is_exported(c, s, a, b):
    memory = MemoryProviders()
    await install(c, memory)
    await c.submit(inc, 1, key="inc-1")
    await async_wait_for(lambda: memory.by_name("default"))
    [default] = memory.by_name("default")
    assert default.attributes[names.SPAN_NAME] == ("default",)
    assert default.parent is None


@gen_cluster(client=True)
async def test_erred_tasks_set_error_status(c, s, a, b):
    memory = MemoryProviders()
    await install(c, memory)
    with span("fails"):
        future = c.submit(lambda: 1 / 0, key="div-0")
        with pytest.raises(ZeroDivisionError):
            await future
    await async_wait_for(lambda: memory.by_name("fails"))
    [fails] = memory.by_name("fails")
    assert fails.status.status_code == StatusCode.ERROR
    assert fails.status.description == "1 task erred: 1 ZeroDivisionError"
    assert fails.attributes[names.SPAN_ERRED_COUNT] == 1


@gen_cluster(client=True)
async def test_span_without_tasks_takes_client_times(c, s, a, b):
    memory = MemoryProviders()
    await install(c, memory)
    with span("wf"):
        with span("nothing"):
            pass
        await c.submit(inc, 1, key="inc-1")
    await async_wait_for(lambda: memory.by_name("nothing") and memory.by_name("wf"))
    [nothing], [wf] = memory.by_name("nothing"), memory.by_name("wf")
    assert nothing.parent.span_id == wf.context.span_id
    assert nothing.attributes[names.SPAN_TASK_COUNT] == 0
    assert nothing.end_time - nothing.start_time < 0.5e9


@gen_cluster(client=True)
async def test_collection_computed_after_idle_timeout_keeps_its_tasks(c, s, a, b):
    memory = MemoryProviders()
    plugin = await install(c, memory, idle_timeout=0.2)
    with span("deferred"):
        d = dask.delayed(inc)(1, dask_key_name="work-1")
    # the client builds a big graph for longer than idle-timeout + grace
    await asyncio.sleep(max(plugin.config.idle_timeout, plugin.grace) + 1.0)
    assert not memory.by_name("deferred")
    computed_at = time()
    assert await c.compute(d) == 2
    await async_wait_for(lambda: memory.by_name("deferred"))
    [deferred] = memory.by_name("deferred")
    assert deferred.attributes[names.SPAN_TASK_COUNT] == 1
    assert deferred.start_time >= (computed_at - 0.1) * 1e9  # the scheduler's times


@gen_cluster(client=True)
async def test_lazy_span_never_computed_is_exported_after_lazy_timeout(c, s, a, b):
    memory = MemoryProviders()
    await install(c, memory, idle_timeout=0.1, lazy_timeout=1.5)
    with span("never computed"):
        d = dask.delayed(inc)(1)
    closed_at = time()
    await async_wait_for(lambda: memory.by_name("never computed"))
    exported_after = time() - closed_at
    [never] = memory.by_name("never computed")
    assert never.attributes[names.SPAN_TASK_COUNT] == 0
    assert exported_after >= 1.5
    assert d is not None


@gen_cluster(client=True)
async def test_a_lazy_span_whose_graph_came_leaves_no_wait_behind(c, s, a, b):
    """A span closed before its graph reached the scheduler waits for it (up to
    lazy-timeout); once the graph came, nothing of that wait is left: no wake-up
    lazy-timeout away outlives the span."""
    memory = MemoryProviders()
    plugin = await install(c, memory, lazy_timeout=600.0)
    with span("built here") as dask_id:
        d = dask.delayed(inc)(1, dask_key_name="built-here-1")
    tracker = tracker_of(plugin)
    await async_wait_for(
        lambda: tracker.record(dask_id) and tracker.record(dask_id).closed_at
    )
    assert await c.compute(d) == 2
    await async_wait_for(lambda: memory.by_name("built here"))
    assert all(when < time() + 60 for when in tracker.pending_wake_ups())


@gen_cluster(client=True)
async def test_lazy_span_is_exported_when_its_client_leaves(c, s, a, b):
    memory = MemoryProviders()
    plugin = await install(c, memory, idle_timeout=60.0, lazy_timeout=60.0)
    async with Client(s.address, asynchronous=True) as c2:
        assert default_client() is c2
        with span("left behind") as dask_id:
            d = dask.delayed(inc)(1)
        tracker = tracker_of(plugin)
        await async_wait_for(
            lambda: tracker.record(dask_id) and tracker.record(dask_id).closed_at
        )
    await async_wait_for(lambda: memory.by_name("left behind"), timeout=10)
    [left] = memory.by_name("left behind")
    assert left.attributes[names.SPAN_TASK_COUNT] == 0
    assert d is not None


@gen_cluster(client=True)
async def test_span_whose_tasks_collided_into_another_span_does_not_wait_idle(
    c, s, a, b
):
    memory = MemoryProviders()
    await install(c, memory, idle_timeout=60.0)
    futures = []
    for i in range(2):
        with span(f"batch-{i}"):
            # same TaskGroup "inc": distributed puts both on the first span
            futures += c.map(inc, range(3), pure=False)
    await c.gather(futures)
    await async_wait_for(
        lambda: memory.by_name("batch-0") and memory.by_name("batch-1"), timeout=15
    )
    [first], [second] = memory.by_name("batch-0"), memory.by_name("batch-1")
    assert first.attributes[names.SPAN_TASK_COUNT] == 6
    assert second.attributes[names.SPAN_TASK_COUNT] == 0


@gen_cluster(client=True)
async def test_shutdown_emits_open_span_as_incomplete(c, s, a, b):
    memory = MemoryProviders()
    await install(c, memory)
    with span("long") as long_id:
        future = c.submit(wait_for_event, "release-slow-1", key="slow-1")
        await async_wait_for(lambda: s.tasks.get("slow-1") is not None
                             and s.tasks["slow-1"].state == "processing")
        await plugin_of(s).close()
        await Event("release-slow-1").set()
        [long] = memory.by_name("long")
        assert long.attributes[names.SPAN_INCOMPLETE] is True
        assert long.attributes[names.SPAN_CLOSE_REASON] == names.CLOSE_REASON_SHUTDOWN
        assert long.context.span_id == otel_span_id(long_id)
        del future


@gen_cluster(client=True)
async def test_metrics_agree_with_cumulative_worker_metrics(c, s, a, b):
    memory = MemoryProviders()
    plugin = await install(c, memory)
    with span("wf") as wf_id:
        await wait(c.map(slowinc, range(6), delay=0.05))
        # (the workers' heartbeats bring the metrics at whatever time the load
        # allows, maybe past a grace period: the span waits for them in its block)
        await async_wait_for(lambda: span_metrics_in(s, [a, b], wf_id))
    await async_wait_for(lambda: memory.by_name("wf"))
    await plugin.flush()
    expected = dict(s.extensions["spans"].spans[wf_id].cumulative_worker_metrics)
    got = {}
    for metric in (
        names.SPAN_ACTIVITY_TIME,
        names.SPAN_ACTIVITY_DATA,
        names.SPAN_ACTIVITY_COUNT,
        names.SPAN_ACTIVITY_CUSTOM,
    ):
        for _, attrs, value in memory.points(metric):
            assert attrs[names.SPAN_NAME] == "wf"
            key = (attrs[names.CONTEXT], attrs[names.TASK_PREFIX], attrs[names.ACTIVITY],
                   attrs[names.UNIT])
            got[key] = value
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-6, abs=1e-9), key
    [wf] = memory.by_name("wf")
    assert wf.attributes["dask.metrics.thread-noncpu.seconds"] == pytest.approx(
        sum(v for k, v in expected.items() if k[2] == "thread-noncpu")
    )


@gen_cluster(client=True)
async def test_worker_wide_metrics(c, s, a, b):
    memory = MemoryProviders()
    plugin = await install(c, memory)
    x = c.submit(inc, 1, key="x", workers=[a.address])
    y = c.submit(inc, x, key="y", workers=[b.address])  # b gathers x from a
    await y
    await async_wait_for(
        lambda: any(
            isinstance(k, tuple) and k[0] == "gather-dep"
            for k in s.cumulative_worker_metrics
        )
    )
    await plugin.flush()
    contexts = set()
    for _, attrs, _ in memory.points(names.WORKER_ACTIVITY_TIME):
        assert set(attrs) == {names.CONTEXT, names.ACTIVITY, names.UNIT}
        contexts.add(attrs[names.CONTEXT])
    assert "gather-dep" in contexts
    assert not contexts & {"execute", "p2p"}


# (no workers: distributed 2024.1.0's scheduler fails their heartbeats without the
# extension, the plugin or not)
@gen_cluster(client=True, nthreads=[], scheduler_kwargs={"extensions": {}})
async def test_scheduler_without_spans_extension_leaves_plugin_idle(c, s, caplog):
    memory = MemoryProviders()
    with caplog.at_level(logging.WARNING, logger="dask_otel_spans"):
        plugin = await install(c, memory)
        future = c.submit(inc, 1, key="idle-1")
        await async_wait_for(lambda: "idle-1" in s.tasks)  # (the hooks ran)
        del future
    assert plugin.transport is None
    assert "no 'spans' extension" in caplog.text
    assert memory.spans() == []


@gen_cluster(client=True)
async def test_close_undoes_heartbeat_wrapping(c, s, a, b):
    ext = s.extensions["spans"]
    original_handler = s.handlers["heartbeat_worker"]
    memory = MemoryProviders()
    plugin = await install(c, memory)
    assert "heartbeat" in ext.__dict__
    assert s.handlers["heartbeat_worker"] is not original_handler
    session = plugin.transport.session
    await plugin.close()
    assert "heartbeat" not in ext.__dict__
    assert s.handlers["heartbeat_worker"] is original_handler
    assert plugin.transport is None
    assert not session.thread.running and not session.pipeline.ender.thread.running


@gen_cluster(client=True)
async def test_the_state_handler_answers_a_client_in_plain_data(c, s, a, b):
    await install(c, MemoryProviders())
    with span("asked"):
        assert await c.submit(inc, 1, key="asked-1") == 2
    reply = await getattr(c.scheduler, names.STATE_HANDLER)(flush=True, exporters=True)
    state = ExportState.from_message(reply)
    assert state.to_message() == reply and state.flushed is True


@gen_cluster(client=True, nthreads=[])
async def test_a_failed_state_question_is_one_error_line_and_an_error_reply(c, s, caplog):
    plugin = await install(c, MemoryProviders())

    async def broken(**kwargs):
        raise OSError("the pipe is gone")

    plugin.export_state = broken
    with caplog.at_level(logging.ERROR, logger="dask_otel_spans"):
        reply = await getattr(c.scheduler, names.STATE_HANDLER)(flush=True)
    assert reply == {"error": "OSError('the pipe is gone')"}
    [line] = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "export state" in line.getMessage() and line.exc_info is None


@gen_cluster(client=True, nthreads=[])
async def test_close_withdraws_the_plugins_metadata_and_state_handler(c, s):
    plugin = await install(c, MemoryProviders())
    assert await plugin_status(c) == "running" and names.STATE_HANDLER in s.handlers
    await plugin.close()
    assert await plugin_status(c) == "absent"
    assert names.STATE_HANDLER not in s.handlers


@gen_cluster(client=True)
async def test_dask_results_and_spans_unchanged_by_plugin(c, s, a, b):
    memory = MemoryProviders()
    await install(c, memory)
    with span("a", "b") as b_id:
        assert await c.submit(inc, 41, key="inc-41") == 42
    ext = s.extensions["spans"]
    assert ext.spans[b_id].name == ("a", "b")
    assert ext.spans[b_id].parent.name == ("a",)
    assert s.tasks["inc-41"].group.span_id == b_id


@gen_cluster(client=True)
async def test_spans_never_emitted_twice(c, s, a, b):
    memory = MemoryProviders()
    plugin = await install(c, memory, idle_timeout=0.5)
    with span("wf") as wf_id:
        await c.submit(inc, 1, key="inc-1")
    await async_wait_for(lambda: memory.by_name("wf"))
    # More tasks on the already emitted span, as a persisted collection built
    # inside the block and computed later would add
    with dask.annotate(span={"name": ("wf",), "ids": (wf_id,)}):
        await c.submit(inc, 2, key="inc-2")
    assert s.tasks["inc-2"].group.span_id == wf_id
    await asyncio.sleep(0.9)  # (past grace and idle timeout: time to emit it again)
    await plugin.close()
    assert len(memory.by_name("wf")) == 1
    ids = [sp.context.span_id for sp in memory.dask_spans()]
    assert len(ids) == len(set(ids))


@gen_cluster(client=True)
async def test_metrics_past_max_series_keep_their_totals(c, s, a, b):
    memory = MemoryProviders()
    plugin = await install(c, memory, max_series=10)
    ids = []
    for i in range(4):
        with span(f"wf-{i}") as sid:
            # a task group (prefix) of its own per span
            keys = [f"step{'abcd'[i]}-{j}" for j in range(3)]
            await wait(c.map(slowinc, range(3), key=keys, delay=0.05))
        ids.append(sid)
    # (the last heartbeats may come after the spans' export: their points count)
    await async_wait_for(lambda: all(span_metrics_in(s, [a, b], sid) for sid in ids))
    await async_wait_for(lambda: len(memory.dask_spans()) == 4)
    await plugin.flush()
    spans = s.extensions["spans"].spans
    # distributed's cumulative_worker_metrics include "idle or other spans"
    seconds = sum(
        v for sid in ids for k, v in spans[sid].cumulative_worker_metrics.items()
        if k[-1] == "seconds"
    )
    points = memory.points(names.SPAN_ACTIVITY_TIME)
    assert sum(v for _, _, v in points) == pytest.approx(seconds)
    assert len(points) <= 10
    assert any(attrs[names.SPAN_NAME] == names.OTHER_SPAN_NAME for _, attrs, _ in points)


@gen_cluster(client=True)
async def test_the_instrumentation_scope_carries_the_package_version(c, s, a, b):
    import dask_otel_spans

    memory = MemoryProviders()
    await install(c, memory)
    with span("versioned"):
        await c.submit(inc, 1, key="versioned-1")
    await async_wait_for(lambda: memory.by_name("versioned"))
    [versioned] = [sp for sp in memory.dask_spans() if sp.name == "versioned"]
    assert versioned.instrumentation_scope.name == "dask_otel_spans"
    assert versioned.instrumentation_scope.version == dask_otel_spans.__version__
    assert dask_otel_spans.__version__ not in ("", "0+unknown")


def fails_on_odd(x: int) -> int:
    if x % 2:
        raise ValueError(f"odd: {x}")
    return x


@gen_cluster(client=True)
async def test_errors_are_kept_when_the_futures_are_released_before_export(c, s, a, b):
    """The usual case: ``compute()`` raised, the futures went out of scope right
    after the block; the span is exported later with its errors counted."""
    memory = MemoryProviders()
    await install(c, memory)
    with span("fails"):
        futures = c.map(fails_on_odd, range(40), key=[("fails", i) for i in range(40)])
        await wait(futures)
    del futures
    await async_wait_for(lambda: not any(("fails", i) in s.tasks for i in range(40)))
    await async_wait_for(lambda: [sp for sp in memory.dask_spans() if sp.name == "fails"])
    [fails] = [sp for sp in memory.dask_spans() if sp.name == "fails"]
    assert fails.attributes[names.SPAN_ERRED_COUNT] == 20
    assert fails.attributes[names.SPAN_TASK_COUNT] == 40
    assert fails.status.status_code == StatusCode.ERROR


@gen_cluster(client=True)
async def test_an_unsampled_client_trace_exports_no_span_but_counts_its_metrics(
        c, s, a, b):
    memory = MemoryProviders()
    plugin = await install(c, memory)
    unsampled = NonRecordingSpan(SpanContext(
        0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, is_remote=False,
        trace_flags=TraceFlags(0),
    ))
    with trace.use_span(unsampled):
        with span("not sampled"):
            await c.submit(slowinc, 1, delay=0.05, key="slowinc-1")
    await async_wait_for(lambda: plugin.ended_count == 1)
    await plugin.flush()
    assert memory.spans() == []
    await async_wait_for(lambda: [
        p for p in memory.points(names.SPAN_ACTIVITY_TIME)
        if p[1][names.SPAN_NAME] == "not sampled"
    ])

"""The plugin's behaviour on in-process clusters (``gen_cluster``), exporting to memory."""
from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from time import time

import dask
import pytest
from distributed import Client, Event, Scheduler, default_client, span as dask_span, wait
from distributed.scheduler import ALL_TASK_STATES
from distributed.utils_test import gen_cluster, inc, slowinc
from opentelemetry import trace
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    StatusCode,
    TraceFlags,
    TraceState,
)

from dask_otel_spans import OTelSpansPlugin, names, span
from dask_otel_spans.emitter import restore_request
from dask_otel_spans.propagation import otel_span_id, otel_trace_id

from conftest import MemoryProviders, async_wait_for

FAST = dict(export_delay=0.1, idle_timeout=1.0, tick_interval=0.05)


async def install(c, memory: MemoryProviders, **settings) -> OTelSpansPlugin:
    plugin = OTelSpansPlugin(
        tracer_provider=memory.tracer_provider,
        meter_provider=memory.meter_provider,
        **{**FAST, **settings},
    )
    await c.register_plugin(plugin)
    return plugin


def plugin_of(s: Scheduler) -> OTelSpansPlugin:
    return s.plugins[names.PLUGIN_NAME]


@gen_cluster(client=True)
async def test_register_plugin_keeps_in_process_providers(c, s, a, b):
    memory = MemoryProviders()
    plugin = await install(c, memory)
    assert plugin_of(s) is plugin
    assert plugin.providers.tracer_provider is memory.tracer_provider
    assert plugin.providers.owned == []


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
    children = [sp for sp in memory.spans() if sp.parent and sp.parent.span_id == wf.context.span_id]
    by_name = {sp.name: sp for sp in children}
    assert set(by_name) == {"inc", "slowinc"}
    assert by_name["inc"].attributes[names.TASK_GROUP_TASK_COUNT] == 5
    assert by_name["slowinc"].attributes[names.TASK_PREFIX] == "slowinc"
    for child in children:
        assert wf.start_time <= child.start_time <= child.end_time <= wf.end_time


@gen_cluster(client=True)
async def test_several_computes_in_one_block_give_one_span(c, s, a, b):
    memory = MemoryProviders()
    plugin = await install(c, memory, export_delay=0.1)
    with span("wf") as wf_id:
        await c.submit(inc, 1, key="inc-1")
        # longer than grace and idle timeout: without the close notice the span
        # would have been emitted after the first compute
        await asyncio.sleep(1.5)
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
    assert fails.status.description == "1 task erred"
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
    await async_wait_for(
        lambda: run_pass(plugin) >= 0
        and dask_id in plugin._open
        and plugin._open[dask_id].closed_at
    )
    assert await c.compute(d) == 2
    await async_wait_for(lambda: memory.by_name("built here"))
    assert not plugin._awaiting_graph
    assert all(when < time() + 60 for when, _ in plugin._wakeups)


@gen_cluster(client=True)
async def test_lazy_span_is_exported_when_its_client_leaves(c, s, a, b):
    memory = MemoryProviders()
    plugin = await install(c, memory, idle_timeout=60.0, lazy_timeout=60.0)
    async with Client(s.address, asynchronous=True) as c2:
        assert default_client() is c2
        with span("left behind") as dask_id:
            d = dask.delayed(inc)(1)
        await async_wait_for(
            lambda: dask_id in plugin._open and plugin._open[dask_id].closed_at
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
        future = c.submit(slowinc, 1, delay=30, key="slow-1")
        await async_wait_for(lambda: s.tasks.get("slow-1") is not None and s.tasks["slow-1"].state == "processing")
        await plugin_of(s).close()
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
            key = (attrs[names.CONTEXT], attrs[names.TASK_PREFIX], attrs[names.ACTIVITY], attrs[names.UNIT])
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


@gen_cluster(client=True, scheduler_kwargs={"extensions": {}})
async def test_scheduler_without_spans_extension_leaves_plugin_idle(c, s, a, b, caplog):
    memory = MemoryProviders()
    with caplog.at_level(logging.WARNING, logger="dask_otel_spans"):
        plugin = await install(c, memory)
        assert await c.submit(inc, 1) == 2
    assert plugin.providers is None
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
    await plugin.close()
    assert "heartbeat" not in ext.__dict__
    assert s.handlers["heartbeat_worker"] is original_handler
    assert plugin.pump._thread is None


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
    plugin = await install(c, memory)
    with span("wf") as wf_id:
        await c.submit(inc, 1, key="inc-1")
    await async_wait_for(lambda: memory.by_name("wf"))
    # More tasks on the already emitted span, as a persisted collection built
    # inside the block and computed later would add
    with dask.annotate(span={"name": ("wf",), "ids": (wf_id,)}):
        await c.submit(inc, 2, key="inc-2")
    assert s.tasks["inc-2"].group.span_id == wf_id
    await asyncio.sleep(1.5)
    await plugin.close()
    assert len(memory.by_name("wf")) == 1
    ids = [sp.context.span_id for sp in memory.dask_spans()]
    assert len(ids) == len(set(ids))


@gen_cluster(client=True)
async def test_graph_arriving_while_a_notice_batch_is_cut_loses_no_notice(c, s, a, b):
    memory = MemoryProviders()
    plugin = await install(c, memory, tick_budget=0.0, tick_interval=3600)

    def nest(level: int):
        with dask_span(f"level-{level}"):
            if level < 9:
                return nest(level + 1)
            chain = dask.get_annotations()["span"]
            return list(chain["ids"]), dask.delayed(inc)(1, dask_key_name="deep")

    ids, deep = nest(0)
    now = time()
    batch = [
        {"ids": ids[: k + 1], "name": [f"level-{i}" for i in range(k + 1)],
         "opened": 1, "enter": now, "exit": now}
        for k in reversed(range(10))
    ]
    # the close notices overtake the graph; their pass is cut after one step...
    plugin.log_event(names.EVENT_TOPIC, batch)
    plugin._tick()
    parked, plugin._work = plugin._work, None
    assert parked is not None
    # ...and the graph that makes their spans arrives before the pass goes on
    assert await c.compute(deep) == 2
    assert all(i in s.extensions["spans"].spans for i in ids)
    plugin._work = parked

    def exported_all() -> bool:
        plugin._run_slice()
        if plugin._work is None:
            plugin._tick()
        return len(memory.dask_spans()) == 10

    await async_wait_for(exported_all, timeout=20)
    reasons = {sp.attributes[names.SPAN_CLOSE_REASON] for sp in memory.dask_spans()}
    assert reasons == {names.CLOSE_REASON_CLIENT}


class _CountingDict(dict):
    """The plugin's table of open spans, counting the look-ups made in it."""

    lookups = 0

    def get(self, key, default=None):
        self.lookups += 1
        return super().get(key, default)


def lookups_per_step_of_a_pass(plugin: OTelSpansPlugin) -> list[int]:
    """Run one pass of the plugin step by step; the look-ups in its table of open
    spans that each step made."""
    plugin._open = _CountingDict(plugin._open)
    plugin._work = plugin._one_pass()
    per_step = []
    for _ in plugin._work:
        per_step.append(plugin._open.lookups)
        plugin._open.lookups = 0
    per_step.append(plugin._open.lookups)
    plugin._work = None
    return per_step


def growth_per_step_of_a_pass(plugin: OTelSpansPlugin, count) -> list[int]:
    """Run one pass of the plugin step by step; how much ``count()`` grew in each
    step."""
    plugin._work = plugin._one_pass()
    per_step, before = [], count()
    for _ in plugin._work:
        per_step.append(count() - before)
        before = count()
    per_step.append(count() - before)
    plugin._work = None
    return per_step


async def one_task_spans_in_their_grace_period(c, plugin: OTelSpansPlugin, n: int,
                                               name: str) -> None:
    """``n`` one-task spans whose tasks are done, judged done by a pass: each waits
    for its grace period."""
    futures = []
    for i in range(n):
        with span(f"{name}-{i}"):
            futures.append(c.submit(inc, i, key=f"{name}{i}"))
    await wait(futures)
    await async_wait_for(
        lambda: run_pass(plugin) >= 0 and plugin.open_span_count == n
        and all(rec.wake_at for rec in plugin._open.values())
    )


@gen_cluster(client=True)
async def test_each_step_of_the_pass_looks_at_a_bounded_number_of_spans(c, s, a, b):
    """A deep tree (a chain of 100 spans with a task each, one graph) does not make a
    step of the pass walk the tree once per span: no step is quadratic in the depth."""
    from dask_otel_spans.plugin import _CHECK_EVERY

    memory = MemoryProviders()
    plugin = await install(c, memory, tick_budget=0.0, tick_interval=3600)
    depth = 100

    def nest(level: int) -> list:
        with dask_span(f"level-{level}"):
            here = dask.delayed(inc)(level, dask_key_name=(f"level-{level}", 0))
            return [here] + (nest(level + 1) if level + 1 < depth else [])

    await wait(c.compute(nest(0)))
    assert plugin._work is None  # nothing ran the pass yet
    per_step = lookups_per_step_of_a_pass(plugin)
    assert len(plugin._open) == depth  # the pass saw the whole chain
    # a slice item costs O(1) look-ups plus, at most, one walk up the chain
    assert max(per_step) <= 4 * _CHECK_EVERY + depth, per_step


def wait_for_event(name: str) -> int:
    Event(name).wait()
    return 1


def run_pass(plugin: OTelSpansPlugin) -> int:
    """One whole pass of the plugin, now; how many readiness checks it made."""
    before = plugin.readiness_checks
    plugin._tick()
    while plugin._work is not None:
        plugin._run_slice()
    return plugin.readiness_checks - before


@gen_cluster(client=True)
async def test_a_pass_checks_only_the_spans_whose_tasks_or_state_changed(c, s, a, b):
    """Open spans that nothing happened to cost a pass nothing: no readiness check
    until their tasks settle (or their wait runs out)."""
    memory = MemoryProviders()
    plugin = await install(c, memory, tick_interval=3600)
    release = Event("release")
    futures = []
    for i in range(20):
        with span(f"blocked-{i}"):
            # a task group of its own per span (key names differ before any "-")
            futures.append(c.submit(wait_for_event, "release", key=f"blocked{i}"))
    # new spans and the blocks' close notices: checked once each
    await async_wait_for(
        lambda: run_pass(plugin) >= 0
        and plugin.open_span_count == 20
        and all(rec.closed_at for rec in plugin._open.values())
    )
    assert run_pass(plugin) == 0  # nothing changed
    await release.set()
    await wait(futures)
    # each span's task settled: none can be ready before its grace period, so
    # the pass only sets when to look (no check), and the next passes wait
    assert run_pass(plugin) == 0
    assert all(rec.wake_at for rec in plugin._open.values())
    assert run_pass(plugin) == 0


@gen_cluster(client=True)
async def test_a_one_task_span_is_checked_once_after_its_task_settles(c, s, a, b):
    """The one readiness check of a closed span of one task, a grace period after
    it settled, finds it ready and emits it: one check per span, not one to start
    the wait and one to end it."""
    memory = MemoryProviders()
    plugin = await install(c, memory, tick_interval=3600)
    futures = []
    for i in range(20):
        with span(f"once-{i}"):
            futures.append(c.submit(inc, i, key=f"once{i}"))
    await wait(futures)
    await async_wait_for(
        lambda: run_pass(plugin) >= 0 and plugin.open_span_count == 20
        and all(rec.closed_at and rec.wake_at for rec in plugin._open.values())
    )
    await asyncio.sleep(max(rec.wake_at for rec in plugin._open.values()) - time() + 0.05)
    assert run_pass(plugin) == 20
    assert plugin.open_span_count == 0
    await plugin.flush()
    assert len(memory.dask_spans()) == 20



@gen_cluster(client=True)
async def test_a_new_span_whose_tasks_run_is_checked_only_once_they_settle(c, s, a, b):
    """When a graph brings a span whose tasks are running, a check could only find it
    not done: none is made then; its tasks queue it when they settle."""
    memory = MemoryProviders()
    plugin = await install(c, memory, tick_interval=3600)
    release = Event("release-new")
    futures = []
    for i in range(10):
        with dask_span(f"new-{i}"):  # (no close notice: only the graph and tasks)
            futures.append(c.submit(wait_for_event, "release-new", key=f"new{i}"))
    before = plugin.readiness_checks
    await async_wait_for(
        lambda: run_pass(plugin) >= 0 and plugin.open_span_count == 10
        and not plugin._pending
    )
    assert plugin.readiness_checks == before
    await release.set()
    await wait(futures)
    assert run_pass(plugin) == 0  # settled: looked at after the grace period
    await asyncio.sleep(max(rec.wake_at for rec in plugin._open.values()) - time() + 0.05)
    assert run_pass(plugin) == 10


@gen_cluster(client=True)
async def test_a_slice_of_the_pass_hands_its_spans_over_in_one_queue_operation(
    c, s, a, b
):
    """The spans a slice of the pass emits reach the emitter's queue together, not
    one queue operation (and thread wake-up) each."""
    memory = MemoryProviders()
    plugin = await install(c, memory, tick_interval=3600, tick_budget=60)
    await one_task_spans_in_their_grace_period(c, plugin, 10, "ready")
    handed: list[list] = []
    plugin.emitter.put = lambda item: handed.append([item])
    plugin.emitter.put_many = lambda items: handed.append(list(items))
    # once their grace period is over, one pass emits them all
    await asyncio.sleep(max(rec.wake_at for rec in plugin._open.values()) - time() + 0.05)
    run_pass(plugin)
    assert plugin.open_span_count == 0
    assert [len(items) for items in handed] == [10]


@gen_cluster(client=True)
async def test_a_step_of_the_pass_handles_a_few_close_notices(c, s, a, b):
    """A burst of close notices (one event each from a synchronous client) runs a
    few to a step, not one step each, nor all in one."""
    from dask_otel_spans.plugin import _NOTICES_PER_STEP

    memory = MemoryProviders()
    plugin = await install(c, memory, tick_interval=3600)
    now = time()
    n = 5 * _NOTICES_PER_STEP + 1
    for i in range(n):  # spans the scheduler has not seen: each notice opens one
        plugin.log_event(names.EVENT_TOPIC, {
            "ids": [f"unseen-{i}"], "name": [f"unseen-{i}"], "opened": 1,
            "enter": now, "exit": now,
        })
    per_step = growth_per_step_of_a_pass(plugin, lambda: plugin.open_span_count)
    assert sum(per_step) == n
    assert max(per_step) == _NOTICES_PER_STEP, per_step


@gen_cluster(client=True)
async def test_a_step_of_the_pass_emits_a_bounded_number_of_spans(c, s, a, b):
    """Spans ready together are emitted a few to a step (an emission costs about
    as much as two readiness checks), then the step yields."""
    from dask_otel_spans.plugin import _CHECKS_PER_STEP, _EMISSION_WEIGHT

    memory = MemoryProviders()
    plugin = await install(c, memory, tick_interval=3600, tick_budget=60)
    await one_task_spans_in_their_grace_period(c, plugin, 12, "emitted")
    await asyncio.sleep(max(rec.wake_at for rec in plugin._open.values()) - time() + 0.05)
    per_step = growth_per_step_of_a_pass(plugin, lambda: plugin.handed_over_count)
    plugin._deliver()
    most = -(-_CHECKS_PER_STEP // _EMISSION_WEIGHT)  # ceil: the step yields past it
    assert sum(per_step) == 12
    assert max(per_step) == most, per_step


@gen_cluster(client=True)
async def test_a_step_of_the_pass_makes_a_bounded_number_of_readiness_checks(c, s, a, b):
    """Checks of spans that are not ready go in small steps, so that a slice of the
    pass ends close to its budget (each check can walk a span's open children)."""
    from dask_otel_spans.plugin import _CHECKS_PER_STEP

    memory = MemoryProviders()
    plugin = await install(c, memory, tick_interval=3600)
    release = Event("release-steps")
    futures = []
    for i in range(5 * _CHECKS_PER_STEP):
        with span(f"running-{i}"):
            futures.append(c.submit(wait_for_event, "release-steps", key=f"running{i}"))
    await async_wait_for(lambda: run_pass(plugin) >= 0 and plugin.open_span_count == 5 * _CHECKS_PER_STEP)
    for rec in plugin._open.values():
        plugin._look_again(rec)  # all of them to check, none ready (tasks running)
    per_step = growth_per_step_of_a_pass(plugin, lambda: plugin.readiness_checks)
    assert sum(per_step) == 5 * _CHECKS_PER_STEP
    assert max(per_step) <= _CHECKS_PER_STEP, per_step
    await release.set()
    await wait(futures)


@gen_cluster(client=True)
async def test_the_check_of_a_span_with_many_open_children_goes_over_several_steps(
    c, s, a, b
):
    """A span whose open children are many (all done, waiting for their grace
    period) is judged over several steps: each step works out a bounded number of
    verdicts, and the walk goes on where the previous step left it."""
    from dask_otel_spans.plugin import _CHECK_EVERY, _VERDICTS_PER_STEP

    memory = MemoryProviders()
    plugin = await install(c, memory, export_delay=3600, tick_interval=3600)
    n_children = 4 * _VERDICTS_PER_STEP
    outs = []
    with dask_span("wide") as wide_id:
        for i in range(n_children):
            with dask_span(f"child-{i}"):
                outs.append(dask.delayed(inc)(i, dask_key_name=(f"wide-{i}", i)))
    await wait(c.compute(outs))
    await async_wait_for(
        lambda: run_pass(plugin) >= 0 and plugin.open_span_count == n_children + 1
    )
    wide = plugin._open[wide_id]
    assert len(wide.open_children) == n_children
    # only the wide span to check, with its verdicts and its finish time to work out
    plugin._to_check.clear()
    plugin._queued.clear()
    wide.done_since = None
    plugin._look_again(wide)
    per_step = lookups_per_step_of_a_pass(plugin)
    assert wide.done_since is not None  # judged done, in the end
    assert len(per_step) > 4
    # one look-up per child, for whether it is done and when it finished
    assert sum(per_step) >= 2 * n_children
    assert max(per_step) <= 2 * _VERDICTS_PER_STEP + 4 * _CHECK_EVERY, per_step


@gen_cluster(client=True)
async def test_a_graph_taken_in_during_a_pass_forgets_only_its_spans_verdicts(c, s, a, b):
    """Events taken in between two steps of a pass forget this pass's verdicts of the
    spans they touch and of their ancestors, and keep the others' (a pass does not
    walk every open tree again after each event)."""
    memory = MemoryProviders()
    plugin = await install(c, memory, export_delay=3600, tick_interval=3600)
    with dask_span("other") as other_id:
        await c.submit(inc, 1, key="other-1")
    with dask_span("parent") as parent_id:
        with dask_span("child") as child_id:
            await c.submit(inc, 1, key="child-1")
            await async_wait_for(
                lambda: run_pass(plugin) >= 0 and plugin.open_span_count == 3
            )
            ids = {other_id, parent_id, child_id}
            plugin._pass_done = dict.fromkeys(ids, True)
            plugin._pass_finished = dict.fromkeys(ids, 1.0)
            await c.submit(inc, 2, key="child-2")  # more tasks in the child span
    assert plugin.pending_event_count > 0
    for _ in plugin._drain():
        pass
    assert set(plugin._pass_done) == set(plugin._pass_finished) == {other_id}


class _CountedGroup:
    """A TaskGroup stand-in counting how often its task states are read."""

    def __init__(self, done: bool):
        self.finished = done
        self.looks = 0
        self.stop = 1.0  # when its last task finished

    @property
    def states(self) -> dict[str, int]:
        self.looks += 1
        return {"memory": 1, "processing": 0 if self.finished else 1}


@pytest.mark.parametrize("state", sorted(ALL_TASK_STATES))
def test_the_plugins_group_verdict_is_taskgroup_done(state):
    """The plugin's own reading of a TaskGroup's task states agrees with
    ``TaskGroup.done``, for a task in each state (next to done tasks or alone)."""
    from distributed.scheduler import TaskGroup, TaskPrefix

    from dask_otel_spans.plugin import _group_done

    for others in (0, 3):
        tg = TaskGroup("g", TaskPrefix("g"))
        tg.states["memory"] = others
        tg.states[state] += 1
        assert _group_done(tg) is tg.done


def test_checking_a_running_span_of_many_groups_looks_at_one_group():
    from types import SimpleNamespace

    from dask_otel_spans.plugin import _OpenSpan

    plugin = OTelSpansPlugin()
    groups = [_CountedGroup(True) for _ in range(99)] + [_CountedGroup(False)]
    rec = _OpenSpan("s", ("s",), ("s",))
    rec.span = SimpleNamespace(groups=groups)
    assert not plugin._own_groups_done(rec)
    looks = sum(g.looks for g in groups)
    assert not plugin._own_groups_done(rec)  # still running
    assert sum(g.looks for g in groups) == looks + 1  # only the unfinished group
    groups[-1].finished = True
    assert plugin._own_groups_done(rec)


def test_a_done_span_of_many_groups_is_judged_over_several_steps():
    """Looking at thousands of task groups of one span is cut in steps, each looking at
    a bounded number of them, and goes on where the previous step stopped."""
    from types import SimpleNamespace

    from dask_otel_spans.plugin import (
        _GROUPS_PER_VERDICT,
        _VERDICTS_PER_STEP,
        _OpenSpan,
        _OutOfStep,
    )

    plugin = OTelSpansPlugin()
    groups = [_CountedGroup(True) for _ in range(5_000)]
    rec = _OpenSpan("s", ("s",), ("s",))
    rec.span = SimpleNamespace(groups=set(groups), children=[])
    plugin._open[rec.id] = rec
    plugin._verdict_limit = _VERDICTS_PER_STEP  # as in a pass
    looks_per_step = []
    while True:
        plugin._verdicts_in_step = 0  # a new step
        before = sum(g.looks for g in groups)
        try:
            done = plugin._is_done(rec)
        except _OutOfStep:
            looks_per_step.append(sum(g.looks for g in groups) - before)
            continue
        looks_per_step.append(sum(g.looks for g in groups) - before)
        break
    assert done
    assert all(g.looks == 1 for g in groups)  # each group looked at once in all
    assert len(looks_per_step) > 1
    assert max(looks_per_step) <= _VERDICTS_PER_STEP * _GROUPS_PER_VERDICT


def _tree_of_records(plugin: OTelSpansPlugin, children_done: list[bool]):
    """An open parent span with open children whose one task group each is done or
    not, as the plugin's records (no scheduler): (parent, children, their groups)."""
    from types import SimpleNamespace

    from dask_otel_spans.plugin import _OpenSpan

    parent = _OpenSpan("p", ("p",), ("p",))
    parent.span = SimpleNamespace(groups=[_CountedGroup(True)], children=[])
    plugin._open[parent.id] = parent
    children, groups = [], []
    for i, done in enumerate(children_done):
        child = _OpenSpan(f"c{i}", ("p", f"c{i}"), ("p", f"c{i}"))
        group = _CountedGroup(done)
        child.span = SimpleNamespace(groups=[group], children=[])
        plugin._open[child.id] = child
        parent.open_children.add(child.id)
        children.append(child)
        groups.append(group)
    return parent, children, groups


def test_waits_for_a_graph_fire_in_time_when_the_latest_one_was_taken_out():
    """Spans closed before their graph wait in order of their wait's end; a wait
    that ends before the latest one put there (taken out since: its graph came)
    goes to the heap instead, and every wait is due at its own time."""
    from dask_otel_spans.plugin import _OpenSpan

    plugin = OTelSpansPlugin()
    plugin._ext = SimpleNamespace(spans={})

    def closed_before_its_graph(dask_id: str, until: float) -> _OpenSpan:
        rec = _OpenSpan(dask_id, (dask_id,), (dask_id,))
        rec.awaiting_graph = True
        plugin._open[dask_id] = rec
        plugin._wake_up_at(rec, until)
        return rec

    closed_before_its_graph("a", 10.0)
    closed_before_its_graph("b", 30.0)
    del plugin._open["b"]
    plugin._awaiting_graph.pop("b")  # (its graph came: no wait is left)
    closed_before_its_graph("c", 20.0)  # (grace grew, then shrank)
    assert list(plugin._awaiting_graph) == ["a"]
    assert plugin._wakeups == [(20.0, "c")]
    due = []
    for now in (9.0, 10.0, 19.0, 20.0):
        for _ in plugin._wake_due(now):
            pass
        due.append(sorted(plugin._queued))
    assert due == [[], ["a"], ["a"], ["a", "c"]]


def test_checking_a_parent_of_a_running_child_looks_at_that_child_first():
    """Once a check found an open child not done, the next checks of its parent (in
    later passes) look at that child first, not at its done siblings."""
    plugin = OTelSpansPlugin()
    parent, children, groups = _tree_of_records(plugin, [True] * 99 + [False])
    assert not plugin._is_done(parent)
    plugin._forget_pass_verdicts()  # a later pass
    looks = [g.looks for g in groups]
    assert not plugin._is_done(parent)
    assert [g.looks for g in groups[:-1]] == looks[:-1]  # no done sibling read
    assert groups[-1].looks == looks[-1] + 1
    groups[-1].finished = True
    plugin._forget_pass_verdicts()
    assert plugin._is_done(parent)  # and a full walk once that child is done


def test_a_child_judged_done_queues_its_parent_only_if_the_parent_waits_for_it():
    """A child found done queues its parent for a check, unless the parent's last
    check found another child not done: that one queues it when it is done."""
    plugin = OTelSpansPlugin()
    parent, (first, second), _ = _tree_of_records(plugin, [True, False])
    assert not plugin._is_done(parent)
    assert parent.unfinished_child == second.id
    plugin._forget_pass_verdicts()
    plugin._ready_at(first, time(), 1.0)
    assert first.done_since is not None and parent.id not in plugin._queued
    second.span.groups[0].finished = True
    plugin._forget_pass_verdicts()
    plugin._ready_at(second, time(), 1.0)
    assert second.done_since is not None and parent.id in plugin._queued


def test_a_parent_of_closed_children_waits_for_their_emission_looking_at_one():
    """Open children whose blocks closed are emitted before their parent can be
    ready: a check of the parent looks at one of them, not at all their groups,
    and finds the parent done once they are emitted."""
    plugin = OTelSpansPlugin()
    parent, children, groups = _tree_of_records(plugin, [True] * 100)
    for child in children:
        child.closed_at = 1.0
    assert not plugin._is_done(parent)
    assert sum(g.looks for g in groups) == 0  # no child's groups read
    assert parent.unfinished_child in parent.open_children
    for child in children[:99]:  # as their emission does
        del plugin._open[child.id]
        parent.open_children.discard(child.id)
    plugin._forget_pass_verdicts()
    assert not plugin._is_done(parent)
    assert parent.unfinished_child == children[99].id
    del plugin._open[children[99].id]
    parent.open_children.clear()
    plugin._forget_pass_verdicts()
    assert plugin._is_done(parent)


def test_a_closed_child_judged_done_leaves_the_queueing_of_its_parent_to_its_emission():
    """A closed child found done does not queue its parent (which waits for its
    emission, and is queued by it)."""
    plugin = OTelSpansPlugin()
    parent, (child,), _ = _tree_of_records(plugin, [True])
    child.closed_at = time()
    plugin._ready_at(child, time(), 3600.0)
    assert child.done_since is not None
    assert parent.id not in plugin._queued


def test_a_span_of_one_group_judged_directly_counts_its_emitted_childrens_finish():
    """The check of a span of one task group and no open child (judged by that group
    alone) finds the same finish as the general walk: the later of the group's last
    task and of the children it emitted."""
    plugin = OTelSpansPlugin()
    parent, (child,), (group,) = _tree_of_records(plugin, [True])
    child.closed_at = 2.0
    child.children_finished_at = 4.0  # an emitted child of its own finished later
    assert plugin._ready_at(child, time(), 1.0) == 5.0
    assert child.finished_at == child.done_since == 4.0
    group.finished = False  # a task of it runs again
    child.done_since = None
    plugin._forget_pass_verdicts()
    assert plugin._ready_at(child, time(), 1.0) is None
    assert child.unfinished_group is group


def test_a_task_settling_again_in_a_span_judged_done_restarts_its_wait():
    """A span judged done waits out the grace period from its last task's finish; a
    task of it that ran again and settled moves that finish, and the wait with it
    (the finish time is kept from the verdict, for the emission)."""
    plugin = OTelSpansPlugin()
    parent, (child,), (group,) = _tree_of_records(plugin, [True])
    child.closed_at = 2.0
    now = time()
    assert plugin._ready_at(child, now, 1.0) == 3.0  # finished at 1.0, closed at 2.0
    assert child.done_since == child.finished_at == 1.0
    group.stop = 5.0  # a task of it ran again
    plugin._settled.add(child.id)
    for _ in plugin._take_settled(now, 1.0):
        pass
    plugin._forget_pass_verdicts()
    assert plugin._ready_at(child, now, 1.0) == 6.0
    assert child.done_since == child.finished_at == 5.0


@gen_cluster(client=True)
async def test_results_let_go_from_a_done_span_queue_no_check(c, s, a, b):
    """Tasks going from memory to released and forgotten (the client let their
    results go) cannot change whether their span is done: no look at it again."""
    memory = MemoryProviders()
    plugin = await install(c, memory, export_delay=3600, tick_interval=3600)
    with dask_span("kept a while"):
        futures = c.map(inc, range(5), key=[f"let-go-{i}" for i in range(5)])
        await wait(futures)
    await async_wait_for(lambda: run_pass(plugin) >= 0 and plugin.open_span_count == 1)
    assert not plugin._settled
    del futures
    await async_wait_for(lambda: not any(f"let-go-{i}" in s.tasks for i in range(5)))
    assert not plugin._settled


@gen_cluster(client=True)
async def test_emitting_a_child_queues_its_parent_only_until_the_parent_is_judged_done(
    c, s, a, b
):
    """An emitted child changes nothing for a parent already judged done (that one
    looks again when its own wait runs out); a parent not judged done is queued."""
    memory = MemoryProviders()
    plugin = await install(c, memory, export_delay=3600, tick_interval=3600)
    with dask_span("parent") as parent_id:
        with dask_span("first") as first_id:
            await c.submit(inc, 1, key="first-1")
        with dask_span("second") as second_id:
            await c.submit(inc, 2, key="second-1")
    await async_wait_for(
        lambda: run_pass(plugin) >= 0
        and plugin.open_span_count == 3
        and plugin._open[parent_id].done_since is not None
    )
    plugin._to_check.clear()
    plugin._queued.clear()
    plugin._emit(plugin._open[first_id], time(), complete=True)
    assert parent_id not in plugin._queued
    plugin._open[parent_id].done_since = None
    plugin._emit(plugin._open[second_id], time(), complete=True)
    assert parent_id in plugin._queued


@gen_cluster(client=True)
async def test_the_request_handed_over_holds_each_field_of_the_record_by_name(
    c, s, a, b
):
    """Requests are made from their fields in order (no named-tuple ``__new__``):
    each named field of what the emitter gets holds what its name says."""
    memory = MemoryProviders()
    plugin = await install(c, memory, export_delay=3600, tick_interval=3600)
    with dask_span("parent") as parent_id:
        with dask_span("leaf") as leaf_id:
            await c.submit(inc, 1, key="leaf-1")
    await async_wait_for(
        lambda: run_pass(plugin) >= 0 and plugin.open_span_count == 2
        and plugin._open[leaf_id].span is not None
    )
    rec = plugin._open[leaf_id]
    rec.close_reason, rec.enter, rec.exit = "a reason", 1.5, 2.5
    handed: list = []
    plugin.emitter.emit_many = handed.extend
    plugin._emit(rec, 42.0, complete=False)
    [plain] = handed
    assert type(plain) is tuple  # (the sender marshals it as it is)
    assert plain[2] == {}  # (no client context: its empty carriers are left out)
    request = restore_request(plain)
    assert (request.tags, request.ids) == (("parent", "leaf"), (parent_id, leaf_id))
    assert request.carried is not rec.carried and request.snapshot.id == leaf_id
    assert (request.now, request.complete, request.close_reason) == (
        42.0, False, "a reason"
    )
    assert (request.enter, request.exit) == (1.5, 2.5)
    assert (request.keep_summary, request.counted) == (True, rec.counted)
    assert rec.counted


@gen_cluster(client=True)
async def test_a_failing_readiness_check_is_logged_once_and_the_span_still_exported(
    c, s, a, b
):
    memory = MemoryProviders()
    plugin = await install(c, memory)
    real_ready_at = plugin._ready_at
    failed: list[str] = []

    def fails_every_check_for_a_while(rec, now, grace):
        if len(failed) < 3:
            failed.append(rec.id)
            raise RuntimeError("boom")
        return real_ready_at(rec, now, grace)

    plugin._ready_at = fails_every_check_for_a_while
    with span("wf"):
        await c.submit(inc, 1, key="inc-1")
    await async_wait_for(lambda: memory.by_name("wf"))
    assert len(failed) == 3
    assert "error:readiness" in plugin._logged


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


def test_max_series_is_a_dask_setting():
    from dask_otel_spans.config import PluginConfig

    assert PluginConfig.from_dask_config().max_series == 2000
    with dask.config.set({"otel-spans.metrics.max-series": 50}):
        assert PluginConfig.from_dask_config().max_series == 50
    with dask.config.set({"otel-spans.metrics.max-series": None}):
        assert PluginConfig.from_dask_config().max_series is None


def test_the_scheduler_keeps_carried_headers_as_sent_and_parses_none(monkeypatch):
    """Close notices and graphs carry W3C headers: the plugin keeps them as sent,
    for the span's translation to parse off the event loop. Collections computed
    after their blocks closed bring the very chain each span's notice carried: the
    graph marks those spans submitted and changes nothing else."""
    from types import SimpleNamespace

    import dask_otel_spans.propagation as propagation

    def no_parse(*args):
        raise AssertionError("parsed on the event loop")

    # (every parse goes through it, whatever imported parse_carried)
    monkeypatch.setattr(propagation, "span_context_from_carrier", no_parse)
    plugin = OTelSpansPlugin()
    plugin._ext = SimpleNamespace(spans={})
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    chain = {"root-id": {"traceparent": traceparent}, "leaf-id": {}}
    now = time()
    plugin._on_close_notice({
        "ids": ["root-id", "leaf-id"], "name": ["root", "leaf"], "opened": 2,
        "otel": chain, "enter": now, "exit": now, "lazy": True,
    }, now, plugin.config.export_delay)
    contexts = {dask_id: dict(rec.carried) for dask_id, rec in plugin._open.items()}
    assert contexts["leaf-id"] == chain
    for _ in plugin._absorb_annotations({("x", 0): chain, ("x", 1): chain}):
        pass
    assert all(rec.submitted for rec in plugin._open.values())
    assert {i: dict(rec.carried) for i, rec in plugin._open.items()} == contexts

"""Peer check: distributed's own span and fine-metrics behaviour, with the plugin
installed, is unchanged (in the spirit of distributed/tests/test_spans.py)."""
from __future__ import annotations

import uuid

import dask
from distributed import span as dask_span
from distributed import wait
from distributed.utils_test import gen_cluster, inc, slowdec, slowinc
from support.plugin import install
from support.polling import async_wait_for
from support.providers import MemoryProviders

from dask_otel_spans import names, span
from dask_otel_spans.scheduler.forwarder import SPANS_PER_STEP


@gen_cluster(client=True)
async def test_span_tree_and_task_attachment(c, s, a, b):
    await install(c, MemoryProviders())
    x = dask.delayed(inc)(1, dask_key_name="x")
    with span("foo") as foo_id:
        y = dask.delayed(inc)(x, dask_key_name="y")
        with span("bar") as bar_id:
            z = dask.delayed(inc)(y, dask_key_name="z")
    assert await c.compute(z) == 4
    ext = s.extensions["spans"]
    assert s.tasks["x"].group.span_id == ext.spans_search_by_name["default",][-1].id
    assert s.tasks["y"].group.span_id == foo_id
    assert s.tasks["z"].group.span_id == bar_id
    assert ext.spans[bar_id].parent is ext.spans[foo_id]
    assert [sp.name for sp in ext.spans[foo_id].children] == [("foo", "bar")]


@gen_cluster(client=True)
async def test_default_span_is_renewed_when_done(c, s, a, b):
    await install(c, MemoryProviders())
    fa = c.submit(inc, 1, key="a")
    await fa
    fb = c.submit(inc, 2, key="b")
    await fb
    defaults = s.extensions["spans"].spans_search_by_name["default",]
    assert len(defaults) == 2
    assert s.tasks["a"].group.span_id != s.tasks["b"].group.span_id


@gen_cluster(client=True)
async def test_task_group_collision_attaches_to_first_span(c, s, a, b):
    await install(c, MemoryProviders())
    with span("first") as first_id:
        x = c.submit(inc, 1, key=("x", 1))
        await x
    with span("second"):
        y = c.submit(inc, 2, key=("x", 2))
        await y
    assert s.tasks[("x", 2)].group.span_id == first_id


@gen_cluster(client=True)
async def test_merged_spans_and_cumulative_metrics(c, s, a, b):
    memory = MemoryProviders()
    plugin = await install(c, memory)
    with dask_span("a"):
        await wait(c.map(slowinc, range(4), delay=0.02))
    with dask_span("b"):
        await wait(c.map(slowdec, range(4), delay=0.02))
    await async_wait_for(lambda: memory.by_name("a") and memory.by_name("b"))
    ext = s.extensions["spans"]
    merged = ext.merge_by_tags("a", "b")
    assert len(merged.children) == 2
    a_sp, b_sp = ext.spans_search_by_name["a",][0], ext.spans_search_by_name["b",][0]
    assert merged.nbytes_total == a_sp.nbytes_total + b_sp.nbytes_total
    key_a = ("execute", "slowinc", "thread-noncpu", "seconds")
    key_b = ("execute", "slowdec", "thread-noncpu", "seconds")
    assert merged.cumulative_worker_metrics[key_a] == a_sp.cumulative_worker_metrics[key_a]
    assert merged.cumulative_worker_metrics[key_b] == b_sp.cumulative_worker_metrics[key_b]
    assert plugin.ended_count >= 2


@gen_cluster(client=True)
async def test_worker_metric_keys_reach_the_scheduler_unchanged(c, s, a, b):
    await install(c, MemoryProviders())
    with span("wf") as wf_id:
        await wait(c.map(slowinc, range(4), delay=0.02))
    ext = s.extensions["spans"]
    key = ("execute", "slowinc", "thread-noncpu", "seconds")
    await async_wait_for(lambda: key in ext.spans[wf_id].cumulative_worker_metrics)
    # per span: span id removed from the key; scheduler-wide: span id squashed
    assert all(len(k) == 4 for k in ext.spans[wf_id].cumulative_worker_metrics)
    assert key in s.cumulative_worker_metrics
    assert not any(
        isinstance(k, tuple) and wf_id in k for k in s.cumulative_worker_metrics
    )


# (the scheduler's state validation after every transition is what a graph of
# hundreds of spans makes slow; what this test checks is the plugin's)
@gen_cluster(client=True, timeout=300, config={"distributed.scheduler.validate": False})
async def test_spans_past_three_forwarder_steps_in_one_graph(c, s, a, b):
    memory = MemoryProviders()
    # the graph is computed after the blocks: spans the scheduler has not seen yet
    # wait for the idle timeout, which must outlast building the graph
    plugin = await install(c, memory, idle_timeout=600)
    n = 3 * SPANS_PER_STEP + 1  # (spans and keys forwarded in four steps)
    outs = []
    for i in range(n):
        with span(f"s{i}"):
            # tuple keys: one TaskGroup per span (no TaskGroup collision) and one
            # collection for the whole graph (distributed deep-copies the graph's
            # collection metadata into every span)
            key = (f"task-{uuid.uuid4().hex}", i)
            outs.append(dask.delayed(inc)(i, dask_key_name=key))
    with span("total"):
        total = dask.delayed(sum)(outs, dask_key_name="total")
    assert await c.compute(total) == sum(range(1, n + 1))
    await async_wait_for(lambda: plugin.ended_count >= n + 1, timeout=180)
    await plugin.flush()
    assert plugin.open_span_count == 0
    assert plugin.forwarder.idle(len(s.workers))
    by_name = {sp.name: sp for sp in memory.dask_spans()}
    assert {f"s{i}" for i in range(n)} <= set(by_name)
    ids = [sp.context.span_id for sp in memory.dask_spans()]
    assert len(ids) == len(set(ids)) == n + 1
    assert all(
        by_name[f"s{i}"].attributes[names.SPAN_TASK_COUNT] == 1 for i in range(n)
    )

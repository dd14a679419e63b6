"""``dask.span.tasks`` on an in-process cluster: the tasks of an open span by state,
per span name, as of its last progress, and back to 0 once the span is exported."""
from __future__ import annotations

from distributed import Event
from distributed.utils_test import gen_cluster, inc
from support.plugin import install, plugin_of, wait_for_event
from support.polling import async_wait_for
from support.providers import MemoryProviders

from dask_otel_spans import names, span


def tasks_of(memory: MemoryProviders, name: str) -> dict[str, float]:
    return {attrs[names.TASK_STATE]: value
            for _, attrs, value in memory.points(names.SPAN_TASKS)
            if attrs[names.SPAN_NAME] == name}


def flushed(s, memory: MemoryProviders, name: str) -> dict[str, float]:
    plugin_of(s).transport.flush(10)
    return tasks_of(memory, name)


@gen_cluster(client=True)
async def test_tasks_of_an_open_span_by_state_then_back_to_zero(c, s, a, b):
    memory = MemoryProviders()
    await install(c, memory, live_after=0, live_interval=0.1)
    release = Event("release-wf")
    with span("wf"):
        await c.gather(c.map(inc, range(5)))
        running = c.submit(wait_for_event, "release-wf", pure=False)
        await async_wait_for(lambda: flushed(s, memory, "wf").get(
            names.TASK_STATE_DONE) == 5, timeout=15)
        await release.set()
        await running
    await async_wait_for(lambda: memory.dask_spans(), timeout=15)
    await async_wait_for(lambda: (by_state := flushed(s, memory, "wf")) and set(
        by_state.values()) == {0}, timeout=15)


@gen_cluster(client=True)
async def test_tasks_of_an_open_span_waiting_to_run_and_running(c, s, a, b):
    memory = MemoryProviders()
    await install(c, memory, live_after=0, live_interval=0.1)
    release = Event("release-queue")
    with span("queue"):
        # (8 tasks, 3 threads: some wait, on the scheduler or on a worker)
        futures = c.map(wait_for_event, ["release-queue"] * 8, pure=False)
        by_state = await async_wait_for(lambda: (found := flushed(s, memory, "queue"))
                                        .get(names.TASK_STATE_WAITING) and found,
                                        timeout=15)
        await release.set()
        await c.gather(futures)
    assert by_state[names.TASK_STATE_RUNNING] + by_state[names.TASK_STATE_WAITING] == 8
    assert by_state[names.TASK_STATE_RUNNING] >= 3

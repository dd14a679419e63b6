"""Task spans (``task-spans``), the exceptions of erred tasks, exemplars, span names
cut to the attribute length limit, and the TaskGroup collision warning, on
in-process clusters exporting to memory."""
from __future__ import annotations

import logging
import time

from distributed import wait
from distributed.metrics import time as scheduler_time
from distributed.utils_test import gen_cluster
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import StatusCode
from support.plugin import install
from support.polling import async_wait_for
from support.providers import MemoryProviders

from dask_otel_spans import names, span
from dask_otel_spans.protocol.propagation import otel_span_id, prefix_span_id


def fails_on_odd(x: int) -> int:
    if x % 2:
        raise ValueError(f"odd {x}")
    return x


def sleeps(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def looks_up(record: int) -> None:
    raise KeyError(f"bad record {record}")


@gen_cluster(client=True)
async def test_erred_tasks_get_spans_with_their_exception_under_their_prefix_span(
        c, s, a, b):
    memory = MemoryProviders()
    await install(c, memory)
    with span("fails") as span_id:
        futures = c.map(fails_on_odd, range(40))
        await wait(futures)
    del futures  # (released before export: the errors stay counted)
    dask_span = await memory.first("fails")
    tasks = memory.task_spans()
    assert len(tasks) == 10  # max-task-spans
    prefix_id = prefix_span_id(span_id, "fails_on_odd")
    for task in tasks:
        assert task.name == "fails_on_odd"
        assert task.parent.span_id == prefix_id
        assert task.context.trace_id == dask_span.context.trace_id
        assert task.status.status_code is StatusCode.ERROR
        assert task.status.description == "ValueError"
        assert task.attributes[names.WORKER_ADDRESS] in (a.address, b.address)
        assert task.attributes[names.TASK_KEY].startswith("fails_on_odd-")
        (event,) = task.events
        assert event.name == "exception"
        assert event.attributes["exception.type"] == "ValueError"
        assert event.attributes["exception.message"].startswith("odd ")
        assert "raise ValueError" in event.attributes["exception.stacktrace"]
        assert task.start_time <= task.end_time
    assert len({t.context.span_id for t in tasks}) == 10
    prefix = memory.prefix_span("fails_on_odd")
    assert prefix.context.span_id == prefix_id
    assert prefix.attributes[names.TASK_SPANS_LEFT_OUT] == 10
    assert dask_span.attributes[names.SPAN_ERRED_COUNT] == 20
    assert dask_span.status.status_code is StatusCode.ERROR


@gen_cluster(client=True)
async def test_the_exception_message_of_a_key_error_is_its_str(c, s, a, b):
    memory = MemoryProviders()
    await install(c, memory)
    with span("lookup"):
        await wait(c.submit(looks_up, 3))
    await memory.first("lookup")
    (task,) = memory.task_spans()
    (event,) = task.events
    assert event.attributes["exception.message"] == str(KeyError("bad record 3"))
    assert event.attributes["exception.stacktrace"].endswith(
        "KeyError: 'bad record 3'"
    )


@gen_cluster(client=True)
async def test_a_prefix_span_of_one_erred_task_lasts_as_long_as_the_task(c, s, a, b):
    memory = MemoryProviders()
    await install(c, memory)
    with span("one error"):
        await wait(c.submit(fails_on_odd, 3))
    dask_span = await memory.first("one error")
    (task,) = memory.task_spans()
    prefix = memory.prefix_span("fails_on_odd")
    assert (prefix.start_time, prefix.end_time) == (task.start_time, task.end_time)
    assert dask_span.end_time == task.end_time


@gen_cluster(client=True)
async def test_without_task_spans_a_prefix_span_of_an_erred_task_takes_its_times(
        c, s, a, b):
    memory = MemoryProviders()
    await install(c, memory, task_spans="none")
    with span("one error"):
        await wait(c.submit(fails_on_odd, 3))
        # (the task's compute ended before; its worker's times come shifted by that
        # worker's estimate of its offset to the scheduler's clock, a few ms
        # in-process, more when heartbeats are slow under load: all of it error)
        offset = max(abs(w.scheduler_delay) for w in (a, b))
        erred_by = (scheduler_time() + offset + 0.05) * 1e9
    dask_span = await memory.first("one error")
    prefix = memory.prefix_span("fails_on_odd")
    assert dask_span.start_time < prefix.start_time <= prefix.end_time <= erred_by
    # the task's own time, not the dask span's (a task of well under a millisecond)
    assert prefix.end_time - prefix.start_time < 0.05e9
    assert dask_span.end_time == prefix.end_time


@gen_cluster(client=True)
async def test_slowest_keeps_the_erred_task_and_then_the_slowest(c, s, a, b):
    memory = MemoryProviders()
    await install(c, memory, task_spans="slowest", max_task_spans=3)
    with span("mixed"):
        # (a negative sleep raises ValueError: one erred task of the group)
        await wait(c.map(sleeps, [0.01, 0.3, 0.02, 0.2, 0.01, -1], pure=False))
    await memory.first("mixed")
    tasks = memory.task_spans()
    assert [t.status.status_code for t in tasks].count(StatusCode.ERROR) == 1
    durations = sorted((t.end_time - t.start_time) / 1e9 for t in tasks
                       if t.status.status_code is not StatusCode.ERROR)
    assert len(durations) == 2 and durations[0] >= 0.19
    ok = [t for t in tasks if t.status.status_code is not StatusCode.ERROR]
    assert all(t.attributes[names.TASK_NBYTES] > 0 for t in ok)


@gen_cluster(client=True)
async def test_all_gives_every_task_a_span_up_to_the_cap(c, s, a, b):
    memory = MemoryProviders()
    await install(c, memory, task_spans="all", max_task_spans=4)
    with span("small"):
        await wait(c.map(sleeps, [0.0] * 6, pure=False))
    await memory.first("small")
    assert len(memory.task_spans()) == 4
    assert memory.prefix_span("sleeps").attributes[names.TASK_SPANS_LEFT_OUT] == 2


@gen_cluster(client=True)
async def test_record_exceptions_off_keeps_the_type_and_drops_message_and_trace(
        c, s, a, b):
    memory = MemoryProviders()
    await install(c, memory, record_exceptions=False)
    with span("private"):
        await wait(c.submit(fails_on_odd, 3))
    await memory.first("private")
    (task,) = memory.task_spans()
    (event,) = task.events
    assert dict(event.attributes) == {"exception.type": "ValueError"}


@gen_cluster(client=True)
async def test_none_makes_no_task_span(c, s, a, b):
    memory = MemoryProviders()
    await install(c, memory, task_spans="none")
    with span("quiet"):
        await wait(c.submit(fails_on_odd, 3))
    dask_span = await memory.first("quiet")
    assert memory.task_spans() == []
    assert dask_span.attributes[names.SPAN_ERRED_COUNT] == 1


@gen_cluster(client=True)
async def test_without_prefix_spans_task_spans_hang_under_the_dask_span(c, s, a, b):
    memory = MemoryProviders()
    await install(c, memory, prefix_spans=False)
    with span("flat") as span_id:
        await wait(c.submit(fails_on_odd, 3))
    await memory.first("flat")
    (task,) = memory.task_spans()
    assert task.parent.span_id == otel_span_id(span_id)


@gen_cluster(client=True)
async def test_a_span_name_is_cut_to_the_attribute_length_limit(c, s, a, b):
    memory = MemoryProviders()
    memory.tracer_provider = TracerProvider(
        span_limits=SpanLimits(max_span_attribute_length=16)
    )
    memory.tracer_provider.add_span_processor(SimpleSpanProcessor(memory.span_exporter))
    await install(c, memory)
    with span("x" * 20_000):
        await c.submit(sleeps, 0.0)
    await async_wait_for(lambda: memory.dask_spans())
    (dask_span,) = memory.dask_spans()
    assert dask_span.name == "x" * 16


@gen_cluster(client=True)
async def test_metric_points_carry_exemplars_of_the_prefix_span(c, s, a, b):
    memory = MemoryProviders()
    await install(c, memory)
    with span("busy") as span_id:
        await wait(c.map(sleeps, [0.05] * 4, pure=False))
    dask_span = await memory.first("busy")
    # (a collection hands out the exemplars offered since the last one: what each
    # poll finds is kept, as the two metrics may reach the SDK in different ones)
    found: list[tuple] = []

    def exemplars():
        data = memory.metric_reader.get_metrics_data()
        for rm in data.resource_metrics if data else ():
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    for dp in m.data.data_points:
                        if dp.attributes.get(names.SPAN_NAME) == "busy":
                            found.extend((m.name, dp.attributes.get(names.TASK_PREFIX), e)
                                         for e in dp.exemplars)
        names_found = {name for name, _, _ in found}
        wanted = {names.SPAN_ACTIVITY_TIME, names.SPAN_DURATION}
        return found if wanted <= names_found else None

    found = await async_wait_for(exemplars)
    trace_id = dask_span.context.trace_id
    for name, prefix, exemplar in found:
        assert exemplar.trace_id == trace_id
        if name == names.SPAN_DURATION or prefix == names.IDLE_PREFIX:
            assert exemplar.span_id == otel_span_id(span_id)
        else:
            assert exemplar.span_id == prefix_span_id(span_id, prefix)


@gen_cluster(client=True)
async def test_a_taskgroup_collision_is_warned_once_per_pair_of_spans(
        c, s, a, b, caplog):
    memory = MemoryProviders()
    await install(c, memory)
    with caplog.at_level(logging.WARNING, logger="dask_otel_spans"):
        for i in range(3):
            with span("batch", f"part {i}"):
                for _ in range(2):  # (two graphs per block: still one warning)
                    await wait(c.map(sleeps, [0.0] * 2, pure=False))
        await async_wait_for(lambda: len([
            r for r in caplog.records if "are counted in span" in r.getMessage()
        ]) == 2)
    warnings = [r.getMessage() for r in caplog.records
                if "are counted in span" in r.getMessage()]
    assert len(warnings) == 2
    assert "'batch/part 1' are counted in span 'batch/part 0'" in warnings[0]
    assert "'sleeps'" in warnings[0] and "names of their own" in warnings[0]
    assert "'batch/part 2'" in warnings[1]

"""One trace per span tree, whoever submits its graphs (``gen_cluster``, scheduler and
worker plugins, exporting to memory): dask spans, prefix spans, task spans, pending
spans and the spans task code makes are in the trace of the tree's root, and every
parent is a span of that trace. (With real processes: ``processes/test_one_trace.py``;
in Jaeger: ``processes/test_jaeger.py``.)"""
from __future__ import annotations

import contextvars
import time
from collections.abc import Iterator

import dask
import distributed
import pytest
from distributed import get_client, rejoin, secede, worker_client
from distributed.utils_test import gen_cluster
from opentelemetry import trace
from support.plugin import install
from support.polling import async_wait_for
from support.providers import MemoryProviders

from dask_otel_spans import OTelWorkerPlugin, names, span
from dask_otel_spans.protocol.propagation import (
    carrier_from_context,
    otel_span_id,
    otel_trace_id,
    prefix_span_id,
)

NO_EXPORT = {"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"}

#: where task code makes its spans (the test's memory providers: in-process workers)
_TASK_TRACER: trace.Tracer | None = None


@pytest.fixture
def task_tracer(memory: MemoryProviders) -> Iterator[None]:
    """Task code makes its spans with ``memory``'s tracer provider."""
    global _TASK_TRACER
    _TASK_TRACER = memory.tracer_provider.get_tracer("task code")
    yield
    _TASK_TRACER = None


def traced(i: int) -> int:
    """Task code: a span of its own (a child of the current span)."""
    assert _TASK_TRACER is not None
    with _TASK_TRACER.start_as_current_span("in task"):
        return i


def inner_through_worker_client(n: int) -> int:
    """The issue's task: a plain ``distributed.span`` opened in a task, more work
    computed through ``worker_client``."""
    time.sleep(0.3)  # (long enough for a progress record and its pending span)
    with worker_client() as wc, distributed.span("inner"):
        return sum(wc.compute([dask.delayed(traced)(i) for i in range(n)], sync=True))


def inner_through_get_client(n: int) -> int:
    """The package's ``span()`` opened in a task, work submitted through
    ``get_client`` after seceding."""
    client = get_client()
    secede()
    try:
        with span("inner"):
            return sum(client.gather(client.map(traced, range(n))))
    finally:
        rejoin()


def more_of_the_same_span(n: int) -> int:
    """A task that submits more tasks to its own span (no span of its own)."""
    with worker_client() as wc:
        return sum(wc.gather(wc.map(traced, range(n))))


async def with_plugins(c, memory: MemoryProviders, **settings) -> None:
    await install(c, memory, **settings)
    await c.register_plugin(OTelWorkerPlugin(environ=NO_EXPORT))


def one_trace(memory: MemoryProviders) -> tuple[int, dict[int, object]]:
    """The trace every exported span is in, and the spans by id; every parent (of
    the spans that have one) is one of them."""
    spans = memory.spans()
    traces = {s.context.trace_id for s in spans}
    assert len(traces) == 1, sorted((s.name, f"{s.context.trace_id:032x}") for s in spans)
    by_id = {s.context.span_id: s for s in spans}
    orphans = [s.name for s in spans if s.parent is not None
               and (s.parent.span_id not in by_id
                    or s.parent.trace_id != s.context.trace_id)]
    assert not orphans, orphans
    return traces.pop(), by_id


def ended_dask_spans(memory: MemoryProviders) -> list:
    """The dask spans exported at their end (no pending span)."""
    return [sp for sp in memory.dask_spans() if names.SPAN_STATE not in sp.attributes]


def in_task_parents(memory: MemoryProviders) -> set[int]:
    return {s.parent.span_id for s in memory.by_name("in task")}


@gen_cluster(client=True)
async def test_a_span_a_task_opens_through_worker_client_is_in_the_clients_trace(
        c, s, a, b, memory, task_tracer):
    await with_plugins(c, memory, live_after=0, live_interval=0.1,
                       live_pending_spans=True, task_spans="all")
    tracer = memory.tracer_provider.get_tracer("client app")
    with tracer.start_as_current_span("request") as request:
        with span("outer") as outer_id:
            assert await c.submit(inner_through_worker_client, 3) == 3
    await async_wait_for(lambda: len(ended_dask_spans(memory)) == 2, timeout=20)
    trace_id, by_id = one_trace(memory)
    assert trace_id == request.get_span_context().trace_id
    (inner,) = [sp for sp in ended_dask_spans(memory) if sp.name == "inner"]
    inner_id = inner.attributes[names.SPAN_ID]
    assert inner.parent.span_id == otel_span_id(outer_id)
    assert by_id[prefix_span_id(inner_id, "traced")].parent.span_id == otel_span_id(
        inner_id)
    assert in_task_parents(memory) == {prefix_span_id(inner_id, "traced")}
    assert len(memory.task_spans("traced")) == 3
    pending = [sp for sp in memory.spans()
               if sp.attributes.get(names.SPAN_STATE) == names.SPAN_STATE_RUNNING]
    assert {sp.parent.span_id for sp in pending} >= {otel_span_id(outer_id)}
    assert all(sp.name in ("outer", "inner") for sp in pending)


@gen_cluster(client=True)
async def test_a_span_a_task_opens_through_get_client_hangs_under_the_tasks_prefix_span(
        c, s, a, b, memory, task_tracer):
    """The package's ``span()`` in a task: the OTel span current there (the task's
    prefix span, in the root's trace) is its parent, as on a client."""
    await with_plugins(c, memory)
    tracer = memory.tracer_provider.get_tracer("client app")
    with tracer.start_as_current_span("request") as request:
        with span("outer") as outer_id:
            assert await c.submit(inner_through_get_client, 3) == 3
    await async_wait_for(lambda: len(memory.dask_spans()) == 2, timeout=20)
    trace_id, by_id = one_trace(memory)
    assert trace_id == request.get_span_context().trace_id
    (inner,) = [sp for sp in memory.dask_spans() if sp.name == "inner"]
    inner_id = inner.attributes[names.SPAN_ID]
    assert inner.parent.span_id == prefix_span_id(outer_id, "inner_through_get_client")
    assert not inner.links
    assert in_task_parents(memory) == {prefix_span_id(inner_id, "traced")}


@gen_cluster(client=True)
async def test_a_span_a_client_and_its_task_submit_to_is_one_span_without_links(
        c, s, a, b, memory, task_tracer):
    await with_plugins(c, memory)
    tracer = memory.tracer_provider.get_tracer("client app")
    with tracer.start_as_current_span("request") as request:
        with span("outer") as outer_id:
            assert await c.submit(more_of_the_same_span, 3) == 3
    await async_wait_for(lambda: memory.dask_spans(), timeout=20)
    trace_id, by_id = one_trace(memory)
    assert trace_id == request.get_span_context().trace_id
    (outer,) = memory.dask_spans()
    assert not outer.links
    assert outer.attributes[names.SPAN_TASK_COUNT] == 4
    assert in_task_parents(memory) == {prefix_span_id(outer_id, "traced")}


@gen_cluster(client=True)
async def test_a_root_without_a_context_keeps_its_tree_in_its_trace_and_links_a_childs(
        c, s, a, b, memory, task_tracer):
    """A plain ``distributed.span`` root (the trace of its dask id) and a child
    opened by ``span()`` under an application's span, of another trace."""
    await with_plugins(c, memory)
    request = trace.NonRecordingSpan(trace.SpanContext(
        0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, is_remote=True,
        trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED)))
    with distributed.span("outer") as outer_id:
        with trace.use_span(request), span("inner") as inner_id:
            assert await c.gather(c.map(traced, range(3))) == [0, 1, 2]
    await async_wait_for(lambda: len(memory.dask_spans()) == 2, timeout=20)
    trace_id, by_id = one_trace(memory)
    assert trace_id == otel_trace_id(outer_id)
    inner = by_id[otel_span_id(inner_id)]
    assert inner.parent.span_id == otel_span_id(outer_id)
    assert [link.context for link in inner.links] == [request.get_span_context()]
    assert in_task_parents(memory) == {prefix_span_id(inner_id, "traced")}


@gen_cluster(client=True)
async def test_a_later_submission_with_another_context_is_a_link(c, s, a, b, memory):
    """Another application submits to a span with a context of its own: the span
    stays in the trace its first graph carried and links to the other context."""
    await install(c, memory)
    tracer = memory.tracer_provider.get_tracer("client app")
    with tracer.start_as_current_span("other request") as other:
        other_carrier = carrier_from_context()
    with tracer.start_as_current_span("request") as request:
        with span("outer") as outer_id:
            await c.submit(str, 1, key="first-1")
            with dask.annotate(**{names.ANNOTATION_KEY: {outer_id: other_carrier}}):
                await c.submit(str, 2, key="second-2")
    await async_wait_for(lambda: memory.dask_spans(), timeout=20)
    (outer,) = memory.dask_spans()
    assert outer.context.trace_id == request.get_span_context().trace_id
    assert outer.parent.span_id == request.get_span_context().span_id
    assert [link.context.span_id for link in outer.links] == [
        other.get_span_context().span_id]


@gen_cluster(client=True)
async def test_a_child_whose_graph_comes_before_its_roots_context_joins_the_roots_trace(
        c, s, a, b, memory):
    """The child's graph carries no context of its tree (another application that
    only has the span annotation) and reaches the scheduler first; the root's
    context comes with its block's close notice."""
    await install(c, memory, task_spans="all")
    tracer = memory.tracer_provider.get_tracer("client app")
    with tracer.start_as_current_span("request") as request:
        with span("outer") as outer_id:
            child = {"name": ("outer", "inner"),
                     "ids": (outer_id, "4b0c6a1e-2f3d-4e5f-8a9b-0c1d2e3f4a5b")}

            def other_application():
                with dask.annotate(span=child):
                    return c.submit(str, 1, key="str-1")

            # (in a context of its own: none of the block's annotations)
            await contextvars.Context().run(other_application)
    await async_wait_for(lambda: len(memory.dask_spans()) == 2, timeout=20)
    trace_id, by_id = one_trace(memory)
    assert trace_id == request.get_span_context().trace_id
    inner = by_id[otel_span_id(child["ids"][-1])]
    assert inner.parent.span_id == otel_span_id(outer_id)
    prefix = by_id[prefix_span_id(child["ids"][-1], "str")]
    assert prefix.parent.span_id == inner.context.span_id

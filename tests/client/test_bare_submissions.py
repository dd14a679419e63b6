"""Bare submissions of an instrumented client (no dask span block open): the caller's
context (``otel-caller``) reaches task code on the workers, with its baggage, and the
OTel span of the dask span the tasks land in links to the caller. Span blocks carry
baggage too. (Under the real launcher: ``processes/test_zero_code.py``.)"""
from __future__ import annotations

import dask
import pytest
from distributed.utils_test import gen_cluster
from opentelemetry import baggage, trace
from opentelemetry import context as otel_context
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from support.plugin import install, plugin_of
from support.polling import async_wait_for

from dask_otel_spans import OTelWorkerPlugin, names, span
from dask_otel_spans.client import caller_carrier
from dask_otel_spans.instrumentation import DaskInstrumentor

NO_EXPORT = {"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"}
TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C


def caller(span_id: int = 0xB7AD6B7169203331) -> NonRecordingSpan:
    return NonRecordingSpan(SpanContext(TRACE_ID, span_id, is_remote=False,
                                        trace_flags=TraceFlags(TraceFlags.SAMPLED)))


def in_task(x: int = 0) -> tuple[int, int, dict]:
    """Task code: the current span's trace and span id, and the baggage."""
    sc = trace.get_current_span().get_span_context()
    return sc.trace_id, sc.span_id, dict(baggage.get_all())


@pytest.fixture
def instrumentor():
    """The instrumentor, off again after the test. A test turns it on once its
    cluster runs (on before, its servers would preload the package as well)."""
    instrumentor = DaskInstrumentor()
    yield instrumentor
    if instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.uninstrument()


@pytest.fixture
def with_baggage():
    token = otel_context.attach(baggage.set_baggage("tenant", "acme"))
    yield
    otel_context.detach(token)


def test_no_caller_is_carried_without_a_span_or_baggage(monkeypatch):
    for variable in ("TRACEPARENT", "TRACESTATE", "BAGGAGE"):
        monkeypatch.delenv(variable, raising=False)
    assert caller_carrier() is None


def test_no_caller_is_carried_inside_a_span_block():
    with trace.use_span(caller()), span("block"):
        assert caller_carrier() is None


def test_the_environment_carriers_are_a_bare_submissions_caller(monkeypatch):
    monkeypatch.setenv("TRACEPARENT", f"00-{TRACE_ID:032x}-{7:016x}-01")
    monkeypatch.setenv("BAGGAGE", "job=nightly")
    assert caller_carrier() == {"traceparent": f"00-{TRACE_ID:032x}-{7:016x}-01",
                                "baggage": "job=nightly"}


@gen_cluster(client=True)
async def test_a_bare_submission_runs_its_task_code_in_the_callers_span(
        c, s, a, b, instrumentor, with_baggage):
    instrumentor.instrument()
    await c.register_plugin(OTelWorkerPlugin(environ=NO_EXPORT))
    parent = caller()
    with trace.use_span(parent):
        got = await c.submit(in_task, 1, key="in_task-1")
    assert got == (TRACE_ID, parent.get_span_context().span_id, {"tenant": "acme"})


@gen_cluster(client=True)
async def test_a_span_blocks_task_code_gets_the_callers_baggage(
        c, s, a, b, with_baggage):
    await c.register_plugin(OTelWorkerPlugin(environ=NO_EXPORT))
    with trace.use_span(caller()), span("etl"):
        trace_id, _, got = await c.submit(in_task, 1, key="in_task-1")
    assert (trace_id, got) == (TRACE_ID, {"tenant": "acme"})


@gen_cluster(client=True)
async def test_the_span_bare_submissions_land_in_links_to_each_distinct_caller(
        c, s, a, b, memory, instrumentor):
    instrumentor.instrument()
    await install(c, memory)
    callers = [caller(span_id) for span_id in (11, 12, 11)]
    for i, parent in enumerate(callers):
        with trace.use_span(parent):
            await c.submit(in_task, i, key=f"in_task-{i}")
    await async_wait_for(lambda: memory.by_name(names.DEFAULT_SPAN_TAG), timeout=10)
    (default,) = memory.by_name(names.DEFAULT_SPAN_TAG)
    assert [(link.context.trace_id, link.context.span_id) for link in default.links] \
        == [(TRACE_ID, 11), (TRACE_ID, 12)]
    assert names.SPAN_LINKS_DROPPED not in default.attributes
    assert not plugin_of(s).transport.session.tracker.open_count


@gen_cluster(client=True)
async def test_callers_past_the_cap_are_counted_not_linked(
        c, s, a, b, memory, instrumentor):
    instrumentor.instrument()
    await install(c, memory)
    n = names.MAX_SPAN_LINKS + 3
    futures = []
    for i in range(n):
        with trace.use_span(caller(1000 + i)):
            futures.append(c.submit(in_task, i, key=f"in_task-{i}"))
    await c.gather(futures)
    await async_wait_for(lambda: memory.by_name(names.DEFAULT_SPAN_TAG), timeout=10)
    (default,) = memory.by_name(names.DEFAULT_SPAN_TAG)
    assert len(default.links) == names.MAX_SPAN_LINKS
    assert default.attributes[names.SPAN_LINKS_DROPPED] == 3


@gen_cluster(client=True)
async def test_uninstrument_stops_carrying_callers(c, s, a, b, memory):
    await install(c, memory)
    instrumentor = DaskInstrumentor()
    instrumentor.instrument()
    instrumentor.uninstrument()
    with trace.use_span(caller()):
        await c.submit(in_task, 1, key="in_task-1")
    state = await c.run_on_scheduler(lambda dask_scheduler: [
        dict(ts.annotations or {}) for ts in dask_scheduler.tasks.values()])
    assert all(names.CALLER_ANNOTATION_KEY not in ann for ann in state)
    assert dask.get_annotations() == {}


@gen_cluster(client=True)
async def test_every_way_of_submitting_carries_the_caller(c, s, a, b, instrumentor):
    await c.register_plugin(OTelWorkerPlugin(environ=NO_EXPORT))
    instrumentor.instrument()
    ways = {
        "submit": lambda: c.submit(in_task, 1, key="in_task-submit"),
        "map": lambda: c.map(in_task, [2], key=["in_task-map"])[0],
        "compute": lambda: c.compute(dask.delayed(in_task)(3, dask_key_name="in_task-c")),
        "persist": lambda: c.persist(dask.delayed(in_task)(4, dask_key_name="in_task-p")
                                     ).dask["in_task-p"],
        # (what dask.compute calls on the distributed scheduler)
        "get": lambda: c.get({"in_task-g": (in_task, 5)}, "in_task-g", sync=False),
    }
    for span_id, (way, submit) in enumerate(ways.items(), 1):
        with trace.use_span(caller(span_id)):
            future = submit()
        assert (await future)[:2] == (TRACE_ID, span_id), way

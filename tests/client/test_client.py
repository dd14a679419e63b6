"""The client helper's close notice, as the scheduler receives it: whether the block
left lazy collections behind, and which client closed it; and the OTel context it
carries for each level of a chain."""
from __future__ import annotations

import logging
import sys
import warnings

import dask
import dask.array as da
import pytest
from distributed.utils_test import gen_cluster, inc
from opentelemetry.sdk.trace import TracerProvider
from support.plugin import install
from support.polling import async_wait_for
from support.providers import MemoryProviders

from dask_otel_spans import OTelSpansPlugin, names, span
from dask_otel_spans.client import plugin_running, plugin_status
from dask_otel_spans.protocol.propagation import otel_span_id


def notices(s) -> dict[str, dict]:
    """The close notices the scheduler logged, by the last tag of the block."""
    out = {}
    for _, msg in s.get_events(names.EVENT_TOPIC):
        for notice in msg if isinstance(msg, (list, tuple)) else [msg]:
            out[notice["name"][-1]] = notice
    return out


@gen_cluster(client=True, nthreads=[])
async def test_block_without_collections_is_not_lazy(c, s):
    with span("nothing"):
        pass
    notice = (await async_wait_for(lambda: notices(s).get("nothing")))
    assert notice["lazy"] is False
    assert notice["client"] == c.id


@gen_cluster(client=True, nthreads=[])
async def test_delayed_built_in_block_and_kept_makes_it_lazy(c, s):
    with span("deferred"):
        d = dask.delayed(inc)(1)
    notice = await async_wait_for(lambda: notices(s).get("deferred"))
    assert notice["lazy"] is True
    assert d is not None


@gen_cluster(client=True, nthreads=[])
async def test_collection_dropped_in_block_is_not_lazy(c, s):
    with span("dropped"):
        dask.delayed(inc)(1)
    notice = await async_wait_for(lambda: notices(s).get("dropped"))
    assert notice["lazy"] is False


@gen_cluster(client=True, nthreads=[])
async def test_lazy_inner_block_makes_its_outer_block_lazy(c, s):
    with span("outer"):
        with span("inner"):
            arr = da.ones(4, chunks=2) + 1
        with span("sibling"):
            pass
    found = await async_wait_for(lambda: len(notices(s)) == 3 and notices(s))
    assert found["inner"]["lazy"] is True
    assert found["sibling"]["lazy"] is False
    assert found["outer"]["lazy"] is True
    assert arr is not None


def carried_inside() -> dict:
    return dict(dask.get_annotations()[names.ANNOTATION_KEY])


@gen_cluster(client=True, nthreads=[])
async def test_a_block_entered_in_its_parent_block_carries_nothing_for_its_own_level(c, s):
    """The OTel span current there is the parent block's reserved span, which the
    scheduler derives from the chain: no header crosses for it."""
    with span("outer") as outer_id:
        with span("inner") as inner_id:
            carried = carried_inside()
    assert carried == {outer_id: {}, inner_id: {}}


@gen_cluster(client=True, nthreads=[])
async def test_a_block_entered_under_an_application_span_carries_that_span(c, s):
    tracer = TracerProvider().get_tracer("app")
    with span("outer") as outer_id:
        with tracer.start_as_current_span("app step") as step:
            with span("inner") as inner_id:
                carried = carried_inside()
    ctx = step.get_span_context()
    traceparent = carried[inner_id]["traceparent"]
    assert traceparent == f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-01"
    assert carried[outer_id] == {}


@gen_cluster(client=True, nthreads=[])
async def test_the_first_block_under_a_client_span_carries_it_and_the_next_level_not(c, s):
    tracer = TracerProvider().get_tracer("app")
    with tracer.start_as_current_span("request") as request:
        with span("outer") as outer_id:
            with span("inner") as inner_id:
                carried = carried_inside()
    ctx = request.get_span_context()
    assert carried[outer_id]["traceparent"].split("-")[2] == f"{ctx.span_id:016x}"
    assert carried[inner_id] == {}


@gen_cluster(client=True, nthreads=[])
async def test_a_block_inside_a_plain_dask_span_carries_the_outer_blocks_span(c, s):
    """Between them a ``distributed.span`` the helper did not open: the current OTel
    span (the outer block's) is not the parent dask span's, so it is carried."""
    import distributed

    with span("outer") as outer_id:
        with distributed.span("plain"):
            with span("inner") as inner_id:
                carried = carried_inside()
    assert carried[inner_id]["traceparent"].split("-")[2] == f"{otel_span_id(outer_id):016x}"


def plugin_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name.startswith("dask_otel_spans.client") and "runs no dask_otel_spans plugin"
            in r.getMessage()]


@gen_cluster(client=True, nthreads=[])
async def test_a_scheduler_without_the_plugin_is_one_warning_per_client(c, s, caplog):
    caplog.set_level(logging.WARNING, logger="dask_otel_spans.client")
    for name in ("first", "second"):
        with span(name):
            pass
    warned = await async_wait_for(lambda: plugin_warnings(caplog))
    await c.scheduler.get_metadata(keys=["anything"], default=None)  # (a round trip)
    assert len(plugin_warnings(caplog)) == 1
    assert s.address in warned[0] and "--preload dask_otel_spans" in warned[0]
    assert "register_plugin" in warned[0]


@pytest.fixture
def plugin_that_cannot_load(monkeypatch):
    """The scheduler plugin's module fails to import (as it did on a release without
    a private name it imported): the preload's ``dask_setup`` raises."""
    monkeypatch.setitem(sys.modules, "dask_otel_spans.scheduler.plugin", None)


@gen_cluster(client=True, nthreads=[], scheduler_kwargs={"preload": ["dask_otel_spans"]})
async def test_a_scheduler_whose_preload_failed_is_one_warning_per_client(
    c, s, caplog, plugin_that_cannot_load
):
    caplog.set_level(logging.WARNING, logger="dask_otel_spans.client")
    assert names.PLUGIN_NAME not in s.plugins  # (distributed: "Failed to start preload")
    with span("unexported"):
        pass
    [warned] = await async_wait_for(lambda: plugin_warnings(caplog))
    assert s.address in warned and "Failed to start preload" in warned


@gen_cluster(client=True, nthreads=[])
async def test_a_scheduler_running_the_plugin_says_so_to_a_client(c, s):
    assert await plugin_running(c) is False
    await install(c, MemoryProviders())
    assert await plugin_running(c) is True


def idle_plugin() -> OTelSpansPlugin:
    """A plugin whose configuration cannot work: it stays idle."""
    return OTelSpansPlugin(environ={"OTEL_TRACES_EXPORTER": "bogus"},
                           use_global_providers=False, export_process=False)


@gen_cluster(client=True, nthreads=[])
async def test_a_scheduler_tells_an_idle_plugin_from_none(c, s):
    assert await plugin_status(c) == "absent"
    await c.register_plugin(idle_plugin())
    assert await plugin_status(c) == "idle"
    assert await plugin_running(c) is False


@gen_cluster(client=True, nthreads=[])
async def test_an_idle_plugin_is_one_warning_pointing_at_the_schedulers_error(
    c, s, caplog
):
    caplog.set_level(logging.WARNING, logger="dask_otel_spans.client")
    await c.register_plugin(idle_plugin())
    with span("unexported"):
        pass
    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records
                if r.name.startswith("dask_otel_spans.client")]

    await async_wait_for(said)
    await c.scheduler.get_metadata(keys=["anything"], default=None)  # (a round trip)
    [line] = said()
    assert "idle" in line and "ERROR line" in line and "--preload" not in line


@gen_cluster(client=True, nthreads=[])
async def test_a_plugin_registered_again_still_says_so_to_a_client(c, s):
    await install(c, MemoryProviders())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # distributed: "overwriting"
        await install(c, MemoryProviders())
    assert await plugin_running(c) is True

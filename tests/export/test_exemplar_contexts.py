"""The exemplars of a span's metric points link to the trace its records say now: a
context that comes after the span's first heartbeat deltas (a graph, a close notice)
is taken for the deltas after it (an export session in this process, no cluster)."""
from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from support.providers import MemoryProviders

from dask_otel_spans import names
from dask_otel_spans.config import PluginConfig
from dask_otel_spans.export.pipeline import ExportPipeline
from dask_otel_spans.export.session import ExportSession
from dask_otel_spans.protocol import events
from dask_otel_spans.sdk.providers import Providers

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CHAIN_HEADERS = {"traceparent": f"00-{CLIENT_TRACE}-00f067aa0ba902b7-01"}


@pytest.fixture
def memory() -> Iterator[MemoryProviders]:
    providers = MemoryProviders()
    yield providers
    providers.shutdown()


@pytest.fixture
def session(memory) -> Iterator[ExportSession]:
    config = PluginConfig.from_dask_config(idle_timeout=60, export_delay=60)
    pipeline = ExportPipeline.build(
        Providers(memory.tracer_provider, memory.meter_provider), config)
    session = ExportSession(pipeline, config, [])
    session.start()
    session.send([events.worker_count(2)])
    yield session
    session.stop(5)


def exemplar_traces(memory: MemoryProviders) -> set[str]:
    """The trace ids of the exemplars collected since the last call."""
    found = set()
    data = memory.metric_reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name != names.SPAN_ACTIVITY_TIME:
                    continue
                for point in metric.data.data_points:
                    found.update(f"{e.trace_id:032x}" for e in point.exemplars)
    return found


def deltas_of(span_id: str) -> events.Message:
    return events.span_deltas({("execute", span_id, "inc", "thread-cpu", "seconds"): 0.5})


def test_deltas_after_a_graph_that_came_late_link_to_the_trace_it_carried(
        session, memory):
    root = str(uuid.uuid4())
    session.send([events.span_added((root,), ("wf",), time.time(), 2, 0),
                  events.group_running(root, 1, "inc"), deltas_of(root)])
    assert session.flush(30)
    before = exemplar_traces(memory)
    assert before and CLIENT_TRACE not in before  # (the trace of its dask id)
    session.send([events.graph_submitted(time.time(), "client-1", [root],
                                         [{root: CHAIN_HEADERS}], [], []),
                  deltas_of(root)])
    assert session.flush(30)
    assert exemplar_traces(memory) == {CLIENT_TRACE}

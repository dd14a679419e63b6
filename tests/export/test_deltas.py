"""Heartbeat deltas reach the span tree and the metrics once per key per pass of the
export session, however many heartbeats named the key."""
from __future__ import annotations

import pytest
from support.providers import MemoryProviders

from dask_otel_spans import names
from dask_otel_spans.config import PluginConfig
from dask_otel_spans.export.deltas import DeltaSums
from dask_otel_spans.export.pipeline import ExportPipeline
from dask_otel_spans.export.session import ExportSession
from dask_otel_spans.protocol import events
from dask_otel_spans.protocol.dask_private import cumulative_metrics
from dask_otel_spans.sdk.providers import Providers

SPAN_ID = "6f1c1e9e-3b0a-4f57-9a49-2f6d1c3f0a11"
CPU = ("execute", SPAN_ID, "inc", "thread-cpu", "seconds")
IO = ("execute", SPAN_ID, "inc", "disk-read", "bytes")


def test_delta_sums_add_up_per_key_and_start_again_after_take():
    sums = DeltaSums()
    sums.add({CPU: 1.0, IO: 10})
    sums.add({CPU: 0.5, "odd key": "not a number"})
    assert sums.messages == 2
    assert sums.take() == {CPU: 1.5, IO: 10}
    assert not sums
    assert sums.take() == {}


@pytest.fixture
def memory():
    return MemoryProviders()


@pytest.fixture
def session(memory):
    pipeline = ExportPipeline.build(
        Providers(tracer_provider=memory.tracer_provider,
                  meter_provider=memory.meter_provider),
        PluginConfig.from_dask_config())
    session = ExportSession(pipeline, PluginConfig.from_dask_config(), [])
    session.start()
    yield session
    session.stop(5)


def test_heartbeats_of_one_pass_are_one_update_per_key(session, memory):
    heartbeats = 20
    session.send([events.span_added((SPAN_ID,), ("wf",), 1.0, 0, 0)])
    assert session.flush(10)
    before = session.pipeline.instruments.updates
    session.send([events.span_deltas({CPU: 0.25, IO: 100})] * heartbeats)
    assert session.flush(10)
    assert session.pipeline.instruments.updates - before == 2
    cpu = [value for _, attrs, value in memory.points(
        f"{names.SPAN_ACTIVITY_PREFIX}time") if attrs[names.ACTIVITY] == "thread-cpu"]
    assert cpu == [pytest.approx(0.25 * heartbeats)]
    assert cumulative_metrics(session.tree.spans[SPAN_ID])[
        ("execute", "inc", "thread-cpu", "seconds")] == pytest.approx(0.25 * heartbeats)

"""The export session's memory follows the spans open, not the spans it saw: thousands
of spans replayed into an ``ExportSession`` in this process (the messages a
scheduler's forwarder sends for ``distributed.span`` blocks of one task group each),
and what the session holds, measured between checkpoints."""
from __future__ import annotations

import gc
import sys
import threading
import time
import types
import uuid
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from support.blocks import block_messages

from dask_otel_spans.config import PluginConfig
from dask_otel_spans.export.metrics import MAX_EXEMPLAR_CONTEXTS
from dask_otel_spans.export.pipeline import ExportPipeline
from dask_otel_spans.export.session import ExportSession
from dask_otel_spans.export.tracking import recent
from dask_otel_spans.export.tracking.recent import RecentSpans
from dask_otel_spans.protocol import events
from dask_otel_spans.sdk.providers import Providers

CLIENT = "Client-6f1c1e9e-eb31-11f1-8b94-02fc00000001"
#: spans replayed before the first checkpoint: past the bounded caches' size (the
#: exemplar contexts of the spans that reported lately) and a round of their turnover
WARM_UP = MAX_EXEMPLAR_CONTEXTS + 500
#: spans replayed between the two checkpoints
MEASURED = 600
#: bytes per span the session may keep more at the second checkpoint: well under
#: one span's smallest entry in a map (a dict slot and its id: ~100 bytes)
MAX_BYTES_PER_SPAN = 16

#: what the walk does not follow: code, classes and modules (shared by the whole
#: process), and loggers (whose manager knows every logger)
_NOT_FOLLOWED = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType,
                 types.CodeType, types.FrameType, types.MethodDescriptorType,
                 types.WrapperDescriptorType, types.GetSetDescriptorType,
                 types.MemberDescriptorType)


def held_bytes(root: object) -> int:
    """The bytes of every object reachable from ``root`` (each counted once), but
    code, classes, modules and loggers."""
    import logging

    seen: set[int] = set()
    stack = [root]
    total = 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, _NOT_FOLLOWED) or isinstance(
                obj, (logging.Logger, logging.Manager, threading.Thread)):
            continue
        total += sys.getsizeof(obj)
        stack.extend(gc.get_referents(obj))
    return total


class _Discard(SpanExporter):
    def export(self, spans):
        return SpanExportResult.SUCCESS

    def shutdown(self):
        pass


def step_messages(i: int, at: float, group: int) -> list[events.Message]:
    """What the forwarder sends for ``with distributed.span("etl", "load"):`` around
    a graph of two tasks of a group of their own, done (the same names every time,
    as a service running one pipeline has)."""
    # (tags as unmarshalled from the pipe: new strings each time)
    tags = ("".join(["et", "l"]), "".join(["lo", "ad"]))
    return block_messages(i, at, group, tags, "".join(["rea", "d"]), CLIENT)


@pytest.fixture
def forgetting_at_once(monkeypatch):
    """Handed-over spans are forgotten at once (not a minute later): the checkpoints
    see what stays for good."""
    monkeypatch.setattr(recent, "REMEMBER_SECONDS", 0.0)
    monkeypatch.setattr(recent, "REMEMBER_GRACE_PERIODS", 0)


def session_of(tracer_provider: TracerProvider,
               meter_provider: MeterProvider) -> Iterator[ExportSession]:
    config = PluginConfig.from_dask_config(idle_timeout=0, export_delay=0)
    pipeline = ExportPipeline.build(Providers(tracer_provider, meter_provider), config)
    session = ExportSession(pipeline, config, [])
    session.start()
    session.send([events.worker_count(2)])
    yield session
    session.stop(5)


@pytest.fixture
def session() -> Iterator[ExportSession]:
    """A session whose providers export to nowhere."""
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(_Discard()))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    yield from session_of(tracer_provider, meter_provider)
    tracer_provider.shutdown()
    meter_provider.shutdown()


@pytest.fixture
def memory_session(memory) -> Iterator[ExportSession]:
    """A session whose providers export to ``memory``."""
    yield from session_of(memory.tracer_provider, memory.meter_provider)


def child_messages(i: int, at: float, root: str, group: int) -> list[events.Message]:
    """What the forwarder sends for a ``distributed.span("request")`` block of two
    tasks below a block of ``root`` still open (a service's span around its
    requests)."""
    child = str(uuid.uuid4())
    prefix = "".join(["rea", "d"])
    return [
        events.span_added((root, child), ("service", "".join(["requ", "est"])), at, 2,
                          i + 1),
        events.graph_submitted(at, CLIENT, [child], None, [], []),
        events.group_running(child, group, prefix),
        events.span_deltas({("execute", child, prefix, "thread-cpu", "seconds"): 0.25}),
        events.group_done(child, group, (prefix, at, at + 0.001, 56, 1e-4, 2, 1, 0.0,
                                         0.0)),
    ]


class Replay:
    """Steps sent to a session, and the session waited for until each is handed over
    and ended; with ``root``, each step is a child of that open span."""

    def __init__(self, session: ExportSession, root: str | None = None):
        self.session = session
        self.root = root
        self.steps = 0
        #: dask spans each step hands over
        self.per_step = 1 if root else 2
        self.before = 0

    def run(self, steps: int, batch: int = 50) -> None:
        session = self.session
        for _ in range(0, steps, batch):
            # (done seconds ago: each span is handed over at the next pass)
            at = time.time() - 10
            messages: list[events.Message] = []
            for _ in range(batch):
                group = 1_000_000 + self.steps
                messages += (child_messages(self.steps, at, self.root, group)
                             if self.root else step_messages(self.steps, at, group))
                self.steps += 1
            session.send(messages)
            assert session.flush(30, exporters=False)
        expected = self.before + self.per_step * self.steps
        deadline = time.monotonic() + 30
        while session.tracker.handed_over < expected and time.monotonic() < deadline:
            session.thread.flush(30)
            session.run_pass()
        assert session.flush(30)
        assert session.tracker.handed_over == expected
        assert session.pipeline.ender.ended_count == expected


def open_root(session: ExportSession) -> str:
    """A root span with a group that runs (open until it is done)."""
    root = str(uuid.uuid4())
    session.send([events.span_added((root,), ("service",), time.time() - 10, 2, 0),
                  events.group_running(root, 1, "listen")])
    return root


def test_the_session_keeps_nothing_per_span_once_spans_are_handed_over(
        session, forgetting_at_once):
    replay = Replay(session)
    replay.run(WARM_UP)
    gc.collect()
    before = held_bytes(session)
    replay.run(MEASURED)
    gc.collect()
    after = held_bytes(session)
    assert session.tracker.open_count == 0
    assert (after - before) / MEASURED < MAX_BYTES_PER_SPAN, (
        f"the session holds {after - before} bytes more after {MEASURED} more spans")


def test_an_open_parent_keeps_nothing_per_child_handed_over(session,
                                                            forgetting_at_once):
    root = open_root(session)
    replay = Replay(session, root)

    def held() -> int:
        # (as a progress record asks: the children waiting to be summed are)
        assert session.tree.spans[root].handed_over_counts is not None
        gc.collect()
        return held_bytes(session)

    replay.run(WARM_UP)
    before = held()
    replay.run(MEASURED)
    after = held()
    assert session.tracker.open_count == 1
    assert (after - before) / MEASURED < MAX_BYTES_PER_SPAN, (
        f"the session holds {after - before} bytes more after {MEASURED} more children")


def test_a_parent_ends_with_the_totals_of_its_children_handed_over_before_it(
        memory_session, memory):
    root = open_root(memory_session)
    replay = Replay(memory_session, root)
    replay.run(30, batch=10)
    at = time.time() - 5
    memory_session.send([events.group_done(root, 1, ("listen", at, at + 1, 0, 0.5, 1, 0,
                                                     0.0, 0.0))])
    replay.before, replay.steps = replay.steps + 1, 0
    replay.run(0)
    (parent,) = [s for s in memory.dask_spans() if s.name == "service"]
    assert parent.attributes["dask.span.task_count"] == 1 + 30 * 2
    assert parent.attributes["dask.span.erred_count"] == 30
    assert parent.attributes["dask.metrics.thread-cpu.seconds"] == pytest.approx(7.5)


def test_a_handed_over_span_is_remembered_for_its_time_then_forgotten():
    spans = RecentSpans()
    spans.add("a", ("etl",), now=100.0, grace=1.0)
    spans.add("b", ("etl", "load"), now=130.0, grace=1.0)
    assert "a" in spans and spans.tags("b") == ("etl", "load")
    spans.expire(100.0 + recent.REMEMBER_SECONDS - 1)
    assert "a" in spans
    spans.expire(100.0 + recent.REMEMBER_SECONDS)
    assert "a" not in spans and "b" in spans
    spans.add("c", ("etl",), now=130.0 + recent.REMEMBER_SECONDS, grace=1.0)
    assert len(spans) == 1 and "c" in spans


def test_a_long_grace_period_keeps_handed_over_spans_longer():
    spans = RecentSpans()
    grace = recent.REMEMBER_SECONDS
    spans.add("a", ("etl",), now=0.0, grace=grace)
    spans.expire(recent.REMEMBER_SECONDS * 2)
    assert "a" in spans
    spans.expire(recent.REMEMBER_GRACE_PERIODS * grace)
    assert "a" not in spans


def test_recent_spans_are_at_most_their_bound_whatever_their_age():
    spans = RecentSpans(max_spans=3)
    for n, span_id in enumerate("abcde"):
        spans.add(span_id, (span_id,), now=float(n), grace=1.0)
    assert len(spans) == 3 and "b" not in spans and "c" in spans

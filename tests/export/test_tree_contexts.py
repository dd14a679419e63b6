"""One trace per span tree on the export side, driven through the readiness tracker's
events and the ender's translation alone (no cluster): the context first carried for
a span stays, a later other one is a link, the root's context reaches every span of
its tree whatever the order it came in."""
from __future__ import annotations

import pytest

from dask_otel_spans.config import PluginConfig
from dask_otel_spans.export.ender import HandOver, SpanEnder
from dask_otel_spans.export.tracking.readiness import ReadinessTracker
from dask_otel_spans.export.tracking.tree import SpanTree
from dask_otel_spans.protocol.propagation import otel_span_id, otel_trace_id

CONFIG = PluginConfig.from_dask_config(export_delay=0.1, idle_timeout=5.0)
ROOT, CHILD = "5c2f3a0e-7d1b-4f7e-9a55-0d6a3c1e2b10", "8f1d2c3b-4a5e-4b6c-8d7e-9f0a1b2c3d4e"
CLIENT = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
OTHER = {"traceparent": "00-11111111111111111111111111111111-2222222222222222-01"}


class Feed:
    """A span tree and its tracker, fed as the export session feeds them."""

    def __init__(self) -> None:
        self.tree = SpanTree([])
        self.tracker = ReadinessTracker(self.tree.spans, self.tree.chain_of, CONFIG,
                                        on_handed_over=self.tree.forget)
        self.handed_over: dict[str, HandOver] = {}

    def span(self, *ids: str) -> None:
        span = self.tree.add_span(ids, ids, 0.0, 0)
        self.tracker.add_span(span, now=0.0)
        self.tree.group(ids[-1], len(self.tree.spans), "inc",
                        ("inc", 0.0, 1.0, 8, 1.0, 1, 0))
        self.tracker.group_done(ids[-1], 1.0)

    def graph(self, *chains: dict) -> None:
        self.tracker.graph(0.5, "client-1", [], list(chains))

    def close(self, *ids: str, at: float, otel: dict) -> None:
        self.tracker.close_notice(at, {"ids": list(ids), "name": list(ids),
                                       "opened": 1, "enter": 0.0, "exit": at,
                                       "otel": otel})

    def run(self, now: float) -> list[str]:
        self.tracker.run_pass(now)
        _, requests = self.tracker.take()
        self.handed_over.update((r.ids[-1], r) for r in requests)
        return [r.ids[-1] for r in requests]


@pytest.fixture
def feed() -> Feed:
    return Feed()


def translated(request: HandOver):
    fields, _ = SpanEnder(None).translate(request)
    return fields


def test_the_first_context_carried_for_a_span_stays_and_a_later_other_one_is_its_link(
        feed):
    feed.span(ROOT)
    feed.graph({ROOT: CLIENT})
    feed.graph({ROOT: OTHER})  # (another application's submission for it)
    feed.graph({ROOT: dict(CLIENT)})  # (the same context again: nothing)
    feed.close(ROOT, at=2.0, otel={ROOT: CLIENT})
    assert feed.run(10.0) == [ROOT]
    fields = translated(feed.handed_over[ROOT])
    assert fields.ids.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert fields.ids.parent_span_id == 0xB7AD6B7169203331
    assert [(link.trace_id, link.span_id) for link in fields.links] == [
        (0x11111111111111111111111111111111, 0x2222222222222222)]


def test_a_childs_context_of_another_trace_is_its_link_and_its_parent_the_root(feed):
    """A plain ``distributed.span`` root (no context: the trace of its dask id),
    and a child opened by ``span()`` with an application's span current."""
    feed.span(ROOT)
    feed.span(ROOT, CHILD)
    feed.graph({CHILD: CLIENT})
    feed.close(ROOT, CHILD, at=2.0, otel={CHILD: CLIENT})
    assert CHILD in feed.run(10.0)
    fields = translated(feed.handed_over[CHILD])
    assert fields.ids.trace_id == otel_trace_id(ROOT)
    assert fields.ids.parent_span_id == otel_span_id(ROOT)
    assert [link.span_id for link in fields.links] == [0xB7AD6B7169203331]


def test_the_roots_context_reaches_a_child_that_came_first_and_ends_after_the_root(
        feed):
    """The child's graph (from a task, carrying no context of the tree) reached the
    scheduler before the root's context, which the root's close notice brings; the
    root is handed over first (the child is a plain span, closed when idle)."""
    feed.span(ROOT)
    feed.span(ROOT, CHILD)
    feed.graph({})
    feed.close(ROOT, at=2.0, otel={ROOT: CLIENT})
    assert feed.run(3.5) == [ROOT]
    assert feed.run(10.0) == [CHILD]
    root, child = (translated(feed.handed_over[i]) for i in (ROOT, CHILD))
    assert root.ids.trace_id == child.ids.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert child.ids.parent_span_id == root.ids.span_id == otel_span_id(ROOT)
    assert not child.links


def test_a_span_submitted_to_again_with_its_own_context_gets_no_link(feed):
    """A client's block and a task inside it submit to the same span: the task's
    graph carries the chain the block carried (the worker passes it on)."""
    feed.span(ROOT)
    feed.graph({ROOT: CLIENT})
    feed.graph({ROOT: {"traceparent": CLIENT["traceparent"]}})
    feed.close(ROOT, at=2.0, otel={ROOT: CLIENT})
    assert feed.run(10.0) == [ROOT]
    assert not translated(feed.handed_over[ROOT]).links


def test_contexts_carried_again_for_adopted_spans_give_the_ids_they_had(feed):
    """A new export process adopts a running tree; the scheduler sends again what
    its tasks' graphs carried: the spans keep the root's trace, and wait for no
    close notice (the one sent before went to the process that died)."""
    feed.span(ROOT)
    feed.span(ROOT, CHILD)
    feed.tracker.carried_again([{ROOT: CLIENT, CHILD: {}}])
    assert not feed.tracker.record(ROOT).helper
    assert feed.run(10.0) == [CHILD, ROOT]  # (idle: no notice awaited)
    root, child = (translated(feed.handed_over[i]) for i in (ROOT, CHILD))
    assert root.ids.trace_id == child.ids.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert root.ids.parent_span_id == 0xB7AD6B7169203331

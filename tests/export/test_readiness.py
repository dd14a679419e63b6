"""The readiness tracker, driven through its events alone: no scheduler, no cluster.

Times are explicit (seconds on the scheduler's clock); the grace period is one
second (two heartbeat intervals of a small cluster, above ``export_delay``)."""
from __future__ import annotations

import logging

import pytest
from distributed.scheduler import TaskPrefix

from dask_otel_spans import names
from dask_otel_spans.config import PluginConfig
from dask_otel_spans.export.metrics import DaskInstruments
from dask_otel_spans.export.tracking.readiness import ReadinessTracker
from dask_otel_spans.export.tracking.tree import SpanTree
from dask_otel_spans.export.tracking.verdicts import Verdicts

CONFIG = PluginConfig.from_dask_config(
    export_delay=0.1, idle_timeout=5.0, lazy_timeout=60.0
)
GRACE = 1.0


class Feed:
    """A span tree and its tracker, fed as the export session feeds them."""

    def __init__(self, config: PluginConfig = CONFIG):
        self.tree = SpanTree([])
        self.tracker = ReadinessTracker(
            self.tree.spans, self.tree.chain_of, config, on_handed_over=self.tree.forget
        )
        self.handed_over: list = []
        self.metric_calls: list = []
        self._groups = 0

    def span(self, *ids: str, at: float = 0.0) -> str:
        """A new span of one chain of ids (its own last), named after its ids."""
        span = self.tree.add_span(ids, ids, at, 0)
        self.tracker.add_span(span, now=at)
        return ids[-1]

    def group(self, span_id: str, *, start: float = 0.0, stop: float | None = None,
              erred: int = 0, key: int | None = None) -> int:
        """A task group of the span: running (``stop`` None) or settled at
        ``stop``."""
        if key is None:
            self._groups += 1
            key = self._groups
        if stop is None:
            self.tree.group(span_id, key, "inc")
        else:
            figures = ("inc", start, stop, 8, stop - start, 1, erred)
            self.tree.group(span_id, key, "inc", figures)
            self.tracker.group_done(span_id, stop)
        return key

    def close(self, *ids: str, at: float, opened: int = 1, **extra) -> None:
        """The client helper's close notice of the innermost ``opened`` levels."""
        self.tracker.close_notice(at, {
            "ids": list(ids), "name": list(ids), "opened": opened, "enter": at - 1,
            "exit": at, **extra,
        })

    def run(self, now: float) -> list[str]:
        """A pass at ``now``; the ids of the spans it handed over."""
        self.tracker.run_pass(now)
        calls, requests = self.tracker.take()
        self.metric_calls += calls
        self.handed_over += requests
        return [request.ids[-1] for request in requests]


@pytest.fixture
def feed() -> Feed:
    return Feed()


def test_a_closed_span_is_handed_over_a_grace_period_after_its_last_task(feed):
    feed.span("s", at=0.0)
    feed.group("s", stop=2.0)
    feed.close("s", at=2.5)
    assert feed.run(3.4) == []
    assert feed.run(3.6) == ["s"]
    [request] = feed.handed_over
    assert request.complete and request.close_reason == names.CLOSE_REASON_CLIENT
    assert (request.enter, request.exit) == (1.5, 2.5)
    assert request.snapshot.groups[0].stop == 2.0


def test_a_span_without_the_client_helper_is_handed_over_once_idle(feed):
    feed.span("plain", at=0.0)
    feed.group("plain", stop=1.0)
    assert feed.run(1.0) == []
    assert feed.run(5.9) == []  # idle-timeout from its last task's finish
    assert feed.run(6.1) == ["plain"]
    assert feed.handed_over[0].close_reason == names.CLOSE_REASON_IDLE


def test_a_span_of_the_client_helper_waits_for_its_close_notice(feed):
    feed.span("s", at=0.0)
    feed.tracker.graph(0.0, "client-1", ["s"], [{"s": {}}])
    feed.group("s", stop=1.0)
    assert feed.run(100.0) == []
    feed.close("s", at=100.0)
    assert feed.run(101.1) == ["s"]


def test_a_running_span_is_not_handed_over(feed):
    feed.span("s", at=0.0)
    feed.group("s")
    feed.close("s", at=1.0)
    assert feed.run(50.0) == []
    assert feed.tracker.open_count == 1


def test_a_parent_is_handed_over_after_its_children_and_ends_with_their_last_task(feed):
    # (the parent has no task group of its own: done with its children)
    feed.span("p", at=0.0)
    feed.span("p", "c", at=0.0)
    feed.group("c", stop=3.0)
    feed.close("p", "c", at=3.0, opened=2)
    assert feed.run(4.1) == ["c", "p"]
    parent = feed.handed_over[1]
    # (no longer its child in the copy: its summary is with the ender)
    assert parent.snapshot.children == ()
    assert feed.handed_over[0].keep_summary and not parent.keep_summary


def test_an_handed_over_span_leaves_the_tree_and_is_never_handed_over_again(feed):
    feed.span("s", at=0.0)
    feed.group("s", stop=1.0)
    feed.close("s", at=1.0)
    assert feed.run(2.1) == ["s"]
    assert "s" not in feed.tree.spans
    # a late heartbeat's or graph's span message for it again
    feed.span("s", at=3.0)
    feed.group("s", stop=4.0)
    feed.close("s", at=4.0)
    assert feed.run(100.0) == []


def test_a_lazy_span_waits_for_its_graph_until_lazy_timeout(feed):
    feed.close("lazy", at=0.0, lazy=True)
    assert feed.run(59.0) == []
    assert feed.run(60.1) == ["lazy"]
    assert feed.handed_over[0].snapshot is None  # the client's times


def test_the_graph_of_a_lazy_span_ends_its_wait(feed):
    feed.close("lazy", at=0.0, lazy=True)
    assert feed.tracker.pending_wake_ups() == [60.0]
    feed.span("lazy", at=1.0)
    feed.tracker.graph(1.0, None, ["lazy"], [{"lazy": {}}])
    feed.group("lazy", stop=2.0)
    assert feed.tracker.pending_wake_ups() == [3.0]  # (its grace, not lazy-timeout)
    assert feed.run(3.1) == ["lazy"]
    assert feed.handed_over[0].snapshot is not None


def test_a_span_whose_tasks_went_to_another_spans_group_waits_only_a_grace_period(feed):
    """Its graph came (its annotation was carried) but its tasks sit in another
    span's TaskGroup: it has no tasks to wait for."""
    feed.close("collided", at=0.0, lazy=True)
    feed.tracker.graph(0.5, None, ["other"], [{"collided": {}}])
    assert feed.run(1.1) == ["collided"]


def test_the_client_leaving_ends_the_wait_for_its_blocks(feed):
    feed.span("s", at=0.0)
    feed.tracker.graph(0.0, "client-1", ["s"], [{"s": {}}])
    feed.group("s", stop=1.0)
    feed.tracker.client_gone(2.0, "client-1")
    assert feed.run(6.9) == []
    assert feed.run(7.1) == ["s"]  # idle-timeout after the client left
    assert feed.handed_over[0].close_reason == names.CLOSE_REASON_CLIENT_GONE


def test_close_hands_over_open_spans_as_incomplete(feed):
    feed.span("running", at=0.0)
    feed.group("running")
    feed.tracker.close(10.0)
    calls, [request] = feed.tracker.take()
    assert not request.complete
    assert request.close_reason == names.CLOSE_REASON_SHUTDOWN
    assert feed.tracker.open_count == 0


def test_a_span_opened_is_counted_once_before_it_is_handed_over(feed):
    feed.span("s", at=0.0)
    feed.group("s", stop=1.0)
    feed.close("s", at=1.0)
    feed.run(2.1)
    assert feed.metric_calls == [(DaskInstruments.span_opened, (("s",),))]
    assert feed.handed_over[0].counted


def test_a_task_settling_again_in_a_span_judged_done_restarts_its_wait(feed):
    feed.span("s", at=0.0)
    key = feed.group("s", stop=1.0)
    feed.close("s", at=2.0)
    assert feed.run(2.5) == []  # ready at 3.0: closed at 2.0, plus grace
    feed.group("s", stop=5.0, key=key)  # a task of it ran again
    assert feed.run(3.1) == []
    assert feed.run(6.1) == ["s"]


def test_waits_for_graphs_fire_in_time_when_the_latest_one_was_taken_out(feed):
    """Spans closed before their graph wait in order of their wait's end; a wait
    that ends before the latest one put there goes to the heap instead."""
    feed.close("a", at=0.0, lazy=True)  # until 60
    feed.close("b", at=30.0, lazy=True)  # until 90
    feed.span("b", at=31.0)  # its graph came: its wait is dropped
    feed.tracker.graph(31.0, None, ["b"], [{"b": {}}])
    feed.group("b")
    # a shorter lazy-timeout now (as a grace period that grew, then shrank)
    feed.tracker.config = PluginConfig.from_dask_config(lazy_timeout=10.0)
    feed.close("c", at=40.0, lazy=True)  # until 50, before a's 60
    assert feed.run(49.0) == []
    assert feed.run(50.0) == ["c"]
    assert feed.run(60.0) == ["a"]


def test_a_closed_child_is_waited_for_until_its_emission(feed):
    """A parent whose children's blocks closed waits for their emission (which
    queues it), not for a walk of their groups."""
    feed.span("p", at=0.0)
    for i in range(3):
        feed.span("p", f"c{i}", at=0.0)
        feed.group(f"c{i}", stop=1.0 + i)
        feed.close("p", f"c{i}", at=1.0 + i)
    feed.close("p", at=3.0)
    assert feed.run(2.5) == ["c0"]
    assert feed.run(3.5) == ["c1"]
    assert feed.run(4.1) == ["c2", "p"]


class CountedGroup:
    """A task group that counts how often its states are read."""

    def __init__(self, done: bool, stop: float = 1.0):
        self.finished = done
        self.looks = 0
        self.key = id(self)
        self.prefix = TaskPrefix("counted")
        self.start, self.stop, self.duration, self.nbytes_total = 0.0, stop, stop, 8

    @property
    def states(self) -> dict[str, int]:
        self.looks += 1
        return {"memory": 1, "processing": 0 if self.finished else 1}


def records_of(feed: Feed, children_done: list[bool]) -> tuple:
    """An open parent with open children of one counted group each."""
    feed.span("p", at=0.0)
    feed.tree.spans["p"].groups.add(CountedGroup(True))
    groups = []
    for i, done in enumerate(children_done):
        feed.span("p", f"c{i}", at=0.0)
        group = CountedGroup(done)
        feed.tree.spans[f"c{i}"].groups.add(group)
        groups.append(group)
    return feed.tracker.record("p"), groups


def test_checking_a_running_span_of_many_groups_looks_at_one_group(feed):
    feed.span("s", at=0.0)
    groups = [CountedGroup(True) for _ in range(99)] + [CountedGroup(False)]
    feed.tree.spans["s"].groups.update(groups)
    rec = feed.tracker.record("s")
    assert not Verdicts.own_groups_done(rec)
    looks = sum(g.looks for g in groups)
    assert not Verdicts.own_groups_done(rec)  # still running
    assert sum(g.looks for g in groups) == looks + 1  # only the unfinished group
    groups[-1].finished = True
    assert Verdicts.own_groups_done(rec)


def test_checking_a_parent_of_a_running_child_looks_at_that_child_first(feed):
    parent, groups = records_of(feed, [True] * 99 + [False])
    records = {i: feed.tracker.record(i) for i in ["p"] + [f"c{i}" for i in range(100)]}
    assert not Verdicts(records).is_done(parent)
    looks = [g.looks for g in groups]
    assert not Verdicts(records).is_done(parent)  # a later pass
    assert [g.looks for g in groups[:-1]] == looks[:-1]  # no done sibling read
    assert groups[-1].looks == looks[-1] + 1
    groups[-1].finished = True
    assert Verdicts(records).is_done(parent)


def test_a_failing_check_is_logged_once_and_the_span_still_handed_over(feed, caplog):
    class FailsThrice(CountedGroup):
        @property
        def states(self):
            self.looks += 1
            if self.looks <= 3:
                raise RuntimeError("boom")
            return {"memory": 1}

    feed.span("s", at=0.0)
    feed.tree.spans["s"].groups.add(FailsThrice(True))
    feed.close("s", at=1.0)
    with caplog.at_level(logging.ERROR, logger="dask_otel_spans"):
        emitted = [feed.run(t) for t in (1.0, 2.1, 3.2, 4.3, 5.4)]
    assert ["s"] in emitted
    assert caplog.text.count("unexpected error in readiness") == 1
    assert feed.handed_over[0].snapshot.groups[0].prefix == "counted"


def test_a_span_that_cannot_be_copied_is_handed_over_without_its_figures(feed, caplog):
    class Unreadable(CountedGroup):
        @property
        def prefix(self):
            raise RuntimeError("boom")

        @prefix.setter
        def prefix(self, value):
            pass

    feed.span("s", at=0.0)
    feed.tree.spans["s"].groups.add(Unreadable(True))
    feed.close("s", at=1.0)
    with caplog.at_level(logging.ERROR, logger="dask_otel_spans"):
        assert feed.run(2.1) == ["s"]
    assert "cannot copy span" in caplog.text
    [request] = feed.handed_over
    assert request.snapshot is None and request.exit == 1.0


def test_carried_headers_are_kept_as_sent_and_parsed_only_by_the_translation(
    feed, monkeypatch
):
    """Close notices and graphs carry W3C headers: the tracker keeps them as sent.
    Collections computed after their blocks closed bring the very chain each span's
    notice carried: the graph marks those spans submitted and changes nothing else."""
    import dask_otel_spans.protocol.propagation as propagation

    def no_parse(*args):
        raise AssertionError("parsed by the tracker")

    monkeypatch.setattr(propagation, "span_context_from_carrier", no_parse)
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    chain = {"root-id": {"traceparent": traceparent}, "leaf-id": {}}
    feed.close("root-id", "leaf-id", at=0.0, opened=2, otel=chain, lazy=True)
    records = [feed.tracker.record(i) for i in ("root-id", "leaf-id")]
    assert [dict(rec.carried) for rec in records] == [chain, chain]
    feed.tracker.graph(1.0, None, [], [chain, chain])
    assert all(rec.submitted for rec in records)
    assert [dict(rec.carried) for rec in records] == [chain, chain]
    assert feed.run(2.1) == ["leaf-id", "root-id"]
    assert feed.handed_over[1].carried == {"root-id": chain["root-id"]}


def test_a_malformed_notice_or_annotation_is_logged_once_and_ignored(feed, caplog):
    with caplog.at_level(logging.WARNING, logger="dask_otel_spans"):
        for _ in range(2):
            feed.tracker.close_notice(0.0, {"ids": ["a"], "name": []})
            feed.tracker.graph(0.0, None, [], "not a chain")
    assert caplog.text.count("malformed close notice") == 1
    assert caplog.text.count("annotation that is not a mapping") == 1
    assert feed.tracker.open_count == 0


def test_a_span_whose_task_group_has_not_come_yet_is_not_done(feed):
    """distributed makes a span with its first task group; the group's message may
    come in a later batch than the span's (a large graph is forwarded in slices)."""
    feed.span("s", at=0.0)
    feed.close("s", at=0.0)
    assert feed.run(10.0) == []
    feed.group("s", stop=10.0)
    assert feed.run(11.1) == ["s"]
    assert feed.handed_over[0].snapshot.groups[0].task_count == 1

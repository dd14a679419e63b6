"""The export side's profiles: windows gathered per dask span and prefix, the wait
of a done span for its profiles (through the readiness tracker's events alone), and
the attributes on its prefix span. No cluster."""
from __future__ import annotations

import logging

import pytest
from distributed import profile

from dask_otel_spans import names
from dask_otel_spans.config import PluginConfig
from dask_otel_spans.export.profiles import ProfileBook, with_profiles
from dask_otel_spans.export.tracking.readiness import ReadinessTracker
from dask_otel_spans.export.tracking.tree import SpanTree

#: (the grace period: two heartbeat intervals of a small cluster, 1 s)
CONFIG = PluginConfig.from_dask_config(export_delay=0.1)


def tree(leaf: str, n: int, caller: str = "task") -> dict:
    """A worker's tree of ``n`` samples whose innermost frame was ``leaf`` (called
    by ``caller``), as ``distributed.profile.process(frame, True, ...)`` counts."""
    state = profile.create()
    state["count"] = n
    state["children"][caller] = {
        "count": n, "identifier": f"{caller};/w/jobs.py;1", "description": {},
        "children": {leaf: {"count": 0, "identifier": f"{leaf};/w/jobs.py;10",
                            "description": {}, "children": {}}}}
    return state


@pytest.fixture
def book() -> ProfileBook:
    return ProfileBook(max_stacks=100)


class Held:
    """A span tree and a tracker whose spans wait for a book's profiles, fed as the
    export session feeds them."""

    def __init__(self, book: ProfileBook):
        self.tree = SpanTree([])
        self.tracker = ReadinessTracker(
            self.tree.spans, self.tree.chain_of, CONFIG,
            on_handed_over=self.tree.forget, held_until=book.held_until)
        self.handed_over: list = []

    def done_and_closed(self, span_id: str, stop: float) -> None:
        self.tracker.add_span(self.tree.add_span((span_id,), (span_id,), 0.0, 0),
                              now=0.0)
        self.tree.group(span_id, 1, "inc", ("inc", 0.0, stop, 8, stop, 1, 0))
        self.tracker.group_done(span_id, stop)
        self.tracker.close_notice(stop, {"ids": [span_id], "name": [span_id],
                                         "opened": 1, "enter": 0.0, "exit": stop})

    def run(self, now: float) -> list[str]:
        """A pass at ``now``; the ids of the spans it handed over."""
        self.tracker.run_pass(now)
        requests = self.tracker.take()[1]
        self.handed_over += requests
        return [request.ids[-1] for request in requests]


@pytest.fixture
def held(book) -> Held:
    return Held(book)


def test_windows_of_a_prefix_add_up_and_the_last_releases_the_span(book):
    book.pending("s", "load", until=20.0)
    assert book.held_until("s") == 20.0
    assert not book.add("s", "load", 0.0, 5.0, [tree("hot_loop", 30)], 0, "", False)
    assert book.add("s", "load", 5.0, 9.0, [tree("hot_loop", 10), tree("parse", 10)],
                    1, "", True)
    assert book.held_until("s") is None
    attributes = book.take("s")["load"].attributes()
    assert attributes[names.PROFILE_SAMPLES] == 50
    assert attributes[names.PROFILE_TOP] == ["hot_loop (jobs.py:10) 80%",
                                             "parse (jobs.py:10) 20%"]
    assert attributes[names.PROFILE_SHARED_SPANS] == 1
    assert names.PROFILE_MISSING not in attributes
    assert book.take("s") is None and len(book) == 0


def test_a_span_waiting_for_two_prefixes_is_released_by_the_second(book):
    book.pending("s", "a", until=20.0)
    book.pending("s", "b", until=30.0)
    assert book.held_until("s") == 30.0
    assert not book.add("s", "a", 0.0, 1.0, [tree("f", 3)], 0, "", True)
    assert book.add("s", "b", 0.0, 1.0, [], 0, "2 of 2 workers did not answer", True)
    assert book.take("s")["b"].attributes() == {
        names.PROFILE_SAMPLES: 0,
        names.PROFILE_MISSING: "2 of 2 workers did not answer"}


def test_a_tree_that_is_not_one_is_skipped_with_one_line(book, caplog):
    with caplog.at_level(logging.INFO, logger="dask_otel_spans"):
        book.add("s", "a", 0.0, 1.0, [{"count": "many"}, {"x": 1}, tree("f", 2)], 0,
                 "", True)
    assert book.unreadable == 2
    assert book.take("s")["a"].tree.total == 2
    assert len([r for r in caplog.records if "not a profile tree" in r.message]) == 1


def test_a_done_span_waits_for_its_profile_until_it_comes(book, held):
    held.done_and_closed("s", stop=2.0)
    book.pending("s", "inc", until=10.0)
    assert held.run(3.5) == []  # past its grace period: held
    assert book.add("s", "inc", 0.0, 2.0, [tree("f", 4)], 0, "", True)
    held.tracker.look_again("s")
    assert held.run(3.6) == ["s"]
    [request] = with_profiles(held.handed_over, book)
    assert request.profiles["inc"].tree.total == 4


def test_a_done_span_waits_for_its_profile_at_most_until_its_wait_ends(book, held):
    held.done_and_closed("s", stop=2.0)
    book.pending("s", "inc", until=10.0)
    assert held.run(9.9) == []
    assert held.run(10.0) == ["s"]
    [request] = with_profiles(held.handed_over, book)
    assert request.profiles is None and book.held_until("s") is None

"""The export process's copy of the span tree: what it emits from forwarded messages,
and that it forgets what it emitted, without a cluster or a child process."""
from __future__ import annotations

import time
from typing import Any

import pytest

from dask_otel_spans import names
from dask_otel_spans.config import PluginConfig
from dask_otel_spans.mirror import SpanMirror

#: grace period: at least two heartbeat intervals of two workers (0.5 s each)
GRACE = 1.0


class Emitter:
    """Keeps the requests in their plain form (tags, ids, carried, snapshot, now,
    complete, close_reason, ...)."""

    def __init__(self) -> None:
        self.requests: list[tuple[Any, ...]] = []

    def emit_many(self, requests: list) -> None:
        self.requests += requests

    def by_name(self) -> dict[tuple[str, ...], tuple[Any, ...]]:
        return {tuple(r[0]): r for r in self.requests}


class Pump:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def submit_many(self, calls: list) -> None:
        self.calls += calls

    def submit(self, method: str, *args: Any) -> None:
        self.calls.append((method, args))


@pytest.fixture
def emitter() -> Emitter:
    return Emitter()


@pytest.fixture
def mirror(emitter: Emitter) -> SpanMirror:
    config = PluginConfig(export_delay=0.1, idle_timeout=30.0, tick_interval=0.05)
    out = SpanMirror(emitter, Pump(), [(0.0, 4)], config)
    out.apply([("workers", 2)])
    return out


def run_until(mirror: SpanMirror, predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        mirror.run_pass()
        time.sleep(0.02)


def notice(ids: list[str], tags: list[str], now: float) -> tuple[Any, ...]:
    msg = {"ids": ids, "name": tags, "opened": 1, "enter": now - 1, "exit": now,
           "otel": {ids[0]: {}}, "client": "client-1"}
    return ("notice", now, msg)


def figures(stop: float, tasks: int = 1, erred: int = 0) -> tuple[Any, ...]:
    return ("inc", stop - 0.5, stop, 28 * tasks, 0.1 * tasks, tasks, erred)


def test_a_closed_span_is_emitted_a_grace_period_after_its_group_settled(mirror, emitter):
    now = time.time()
    mirror.apply([("span", ("a",), ("load",), now, 0), ("run", "a", "inc-1", "inc")])
    mirror.apply_events([("graph", now, "client-1", ["a"], [{"a": {}}])])
    mirror.run_pass()
    mirror.apply([("done", "a", "inc-1", figures(time.time()))])
    mirror.apply_events([notice(["a"], ["load"], time.time())])
    mirror.run_pass()
    assert emitter.requests == []  # (the grace period runs)
    run_until(mirror, lambda: emitter.requests)
    tags, ids, _, snapshot, _, complete, reason = emitter.requests[0][:7]
    assert (tags, ids, complete, reason) == (
        ("load",), ("a",), True, names.CLOSE_REASON_CLIENT
    )
    assert [g[5] for g in snapshot[3]] == [1]  # its group's task count


def test_a_span_with_a_running_group_is_not_emitted(mirror, emitter):
    now = time.time()
    mirror.apply([("span", ("a",), ("load",), now, 0), ("run", "a", "inc-1", "inc")])
    mirror.apply_events([notice(["a"], ["load"], now)])
    deadline = time.monotonic() + 2 * GRACE
    while time.monotonic() < deadline:
        mirror.run_pass()
        time.sleep(0.05)
    assert emitter.requests == []
    assert mirror.stats()["open"] == 1


def test_a_group_that_runs_again_holds_its_span_back(mirror, emitter):
    now = time.time()
    mirror.apply([("span", ("a",), ("load",), now, 0),
                  ("done", "a", "inc-1", figures(now))])
    mirror.apply_events([notice(["a"], ["load"], now)])
    mirror.run_pass()
    mirror.apply([("run", "a", "inc-1", "inc")])  # (a worker died: recomputed)
    deadline = time.monotonic() + 2 * GRACE
    while time.monotonic() < deadline:
        mirror.run_pass()
        time.sleep(0.05)
    assert emitter.requests == []
    mirror.apply([("done", "a", "inc-1", figures(time.time(), tasks=2))])
    run_until(mirror, lambda: emitter.requests)
    assert [g[5] for g in emitter.requests[0][3][3]] == [2]


def test_deltas_are_summed_into_the_span_and_sent_with_its_tags(mirror, emitter):
    now = time.time()
    mirror.apply([("span", ("a",), ("load",), now, 0),
                  ("done", "a", "inc-1", figures(now))])
    key = ("execute", "a", "inc", "thread-cpu", "seconds")
    update = [mirror.add_deltas({key: 1.5}), mirror.add_deltas({key: 0.5})]
    assert update[0] == ("add_span_deltas", ({key: 1.5}, {"a": ("load",)}))
    mirror.apply_events([notice(["a"], ["load"], now)])
    run_until(mirror, lambda: emitter.requests)
    snapshot = emitter.requests[0][3]
    assert snapshot[4] == {("execute", "inc", "thread-cpu", "seconds"): 2.0}


def test_a_parent_is_emitted_after_its_children_with_their_ids(mirror, emitter):
    now = time.time()
    mirror.apply([
        ("span", ("p",), ("root",), now, 0),
        ("span", ("p", "a"), ("root", "a"), now, 0),
        ("span", ("p", "b"), ("root", "b"), now, 0),
        ("done", "a", "inc-1", figures(now)),
        ("done", "b", "inc-2", figures(now)),
    ])
    mirror.apply_events([notice(["p", "a"], ["root", "a"], now),
                         notice(["p", "b"], ["root", "b"], now),
                         notice(["p"], ["root"], now)])
    run_until(mirror, lambda: len(emitter.requests) == 3)
    order = [r[0] for r in emitter.requests]
    assert order[-1] == ("root",)
    root_snapshot = emitter.by_name()[("root",)][3]
    assert sorted(root_snapshot[5]) == ["a", "b"]  # (emitted: by id)


def test_emitted_spans_leave_the_copy(mirror, emitter):
    now = time.time()
    items = [("span", ("p",), ("root",), now, 0)]
    for i in range(50):
        items += [("span", ("p", f"c{i}"), ("root", f"c{i}"), now, 0),
                  ("done", f"c{i}", f"inc-{i}", figures(now))]
    mirror.apply(items)
    mirror.apply_events([notice(["p", f"c{i}"], ["root", f"c{i}"], now)
                         for i in range(50)] + [notice(["p"], ["root"], now)])
    run_until(mirror, lambda: len(emitter.requests) == 51)
    assert (mirror.spans, mirror.groups, mirror.chains) == ({}, {}, {})
    assert mirror.stats()["open"] == 0


def test_a_child_of_an_emitted_parent_is_emitted_under_it(mirror, emitter):
    now = time.time()
    mirror.apply([("span", ("p",), ("root",), now, 0)])
    mirror.apply_events([notice(["p"], ["root"], now)])
    run_until(mirror, lambda: emitter.requests)
    mirror.apply([("span", ("p", "late"), ("root", "late"), now, 0),
                  ("done", "late", "inc-9", figures(time.time()))])
    mirror.apply_events([notice(["p", "late"], ["root", "late"], time.time())])
    run_until(mirror, lambda: len(emitter.requests) == 2)
    assert emitter.by_name()[("root", "late")][1] == ("p", "late")


def test_late_deltas_of_an_emitted_span_keep_its_tags(mirror, emitter):
    now = time.time()
    mirror.apply([("span", ("a",), ("load",), now, 0)])
    mirror.apply_events([notice(["a"], ["load"], now)])
    run_until(mirror, lambda: emitter.requests)
    key = ("execute", "a", "inc", "thread-cpu", "seconds")
    assert mirror.add_deltas({key: 1.0})[1][1] == {"a": ("load",)}


def test_unreadable_messages_are_logged_once_and_the_rest_applied(mirror, caplog):
    now = time.time()
    mirror.apply([("span",), ("span", 5), ("span", ("a",), ("load",), now, 0)])
    mirror.apply_events([("graph",), ("notice",)])
    assert "a" in mirror.spans
    assert caplog.text.count("cannot read") == 2  # (one per kind: messages, events)


def test_spans_still_open_at_close_are_emitted_incomplete(mirror, emitter):
    now = time.time()
    mirror.apply([("span", ("a",), ("load",), now, 0), ("run", "a", "inc-1", "inc")])
    mirror.close()
    [request] = emitter.requests
    assert request[5] is False  # complete


def test_the_copy_reports_the_highest_place_of_the_spans_it_has(mirror):
    now = time.time()
    mirror.apply([("span", ("a",), ("load",), now, 0, 7),
                  ("span", ("b",), ("save",), now, 0, 3),
                  ("span", ("c",), ("old",), now, 0)])  # (no place: an ancestor)
    assert mirror.stats()["last_position"] == 7

"""The live progress bookkeeping, driven by events and a fake clock: when a span's
started record is due, which spans get progress records, the bound, and nothing after
a span ended."""
from __future__ import annotations

import pytest
from distributed.spans import Span

from dask_otel_spans.export.tracking.progress import (
    LiveProgress,
    TaskCounts,
    is_over,
    task_counts,
)
from dask_otel_spans.export.tracking.tree import SpanTree

COUNTS = TaskCounts(done=3)


def counts(span_id: str) -> TaskCounts:
    return COUNTS


def live(after: float = 10.0, interval: float = 5.0, max_spans: int = 50) -> LiveProgress:
    return LiveProgress(after, interval, max_spans)


def test_started_is_due_once_a_graph_names_the_span():
    p = live()
    p.learned("a", ("a",), start=100.0, now=100.0)
    assert p.look(100.1, counts).started == []
    p.ids_final(["a"])
    assert p.look(100.2, counts).started == ["a"]
    assert p.look(100.3, counts).started == []


def test_a_graph_naming_a_child_makes_its_ancestors_ids_final():
    p = live()
    p.learned("root", ("root",), 100.0, 100.0)
    p.learned("child", ("root", "child"), 100.0, 100.0)
    p.ids_final(["child"])
    assert sorted(p.look(100.1, counts).started) == ["child", "root"]


def test_started_waits_at_most_one_interval_for_a_graph():
    p = live(interval=5.0)
    p.learned("a", ("a",), 100.0, 100.0)
    assert p.look(104.9, counts).started == []
    assert p.look(105.0, counts).started == ["a"]


def test_a_span_that_ends_before_its_started_record_has_it_said_due_once():
    p = live()
    p.learned("a", ("a",), 100.0, 100.0)
    assert p.ended("a") is True
    assert p.ended("a") is False
    assert p.look(200.0, counts).started == []


def test_a_span_started_already_needs_no_started_record_at_its_end():
    p = live()
    p.learned("a", ("a",), 100.0, 100.0)
    p.ids_final(["a"])
    p.look(100.1, counts)
    assert p.ended("a") is False


def test_progress_comes_every_interval_for_spans_open_longer_than_after():
    p = live(after=10.0, interval=5.0)
    p.learned("a", ("a",), 100.0, 100.0)
    p.ids_final(["a"])
    rounds = [(t, [r.span_id for r in p.look(t, counts).progress])
              for t in (105.0, 110.0, 112.0, 115.0, 118.0, 120.0)]
    # the first round (105) is before `after`; then one per interval
    assert rounds == [(105.0, []), (110.0, ["a"]), (112.0, []), (115.0, ["a"]),
                      (118.0, []), (120.0, ["a"])]


def test_progress_says_elapsed_since_the_span_was_enqueued():
    p = live(after=0.0, interval=1.0)
    p.learned("a", ("a",), start=95.0, now=100.0)
    p.ids_final(["a"])
    [progress] = p.look(101.0, counts).progress
    assert progress.elapsed == 6.0 and progress.counts == COUNTS


def test_no_progress_after_the_span_ended():
    p = live(after=0.0, interval=1.0)
    p.learned("a", ("a",), 100.0, 100.0)
    p.ids_final(["a"])
    assert p.look(101.0, counts).progress
    p.ended("a")
    assert not any(p.look(t, counts).progress for t in (102.0, 103.0, 104.0))


def test_past_the_bound_the_longest_running_are_reported_and_the_rest_counted():
    p = live(after=0.0, interval=1.0, max_spans=2)
    for i, name in enumerate("abcd"):
        p.learned(name, (name,), start=100.0 - i, now=100.0)
    p.ids_final("abcd")
    look = p.look(101.0, counts)
    assert [r.span_id for r in look.progress] == ["d", "c"]
    assert look.not_reported == 2


def test_a_span_without_counts_gets_no_progress_record():
    p = live(after=0.0, interval=1.0)
    p.learned("a", ("a",), 100.0, 100.0)
    p.ids_final(["a"])
    assert p.look(101.0, lambda span_id: None).progress == []


def test_task_counts_sum_the_tree_settled_groups_tasks_and_count_running_groups():
    tree = SpanTree([(0.0, 4)])
    tree.add_span(("r",), ("wf",), 1.0, 0)
    tree.add_span(("r", "c"), ("wf", "part"), 1.0, 0)
    tree.group("r", 1, "load", ("load", 1.0, 2.0, 10, 1.0, 5, 1))
    tree.group("c", 2, "fit", ("fit", 1.0, 2.0, 10, 1.0, 7, 0))
    tree.group("c", 3, "score")
    tree.group_erred("c", 3, 2)
    tree.add_deltas({("execute", "c", "fit", "thread-cpu", "seconds"): 1.5,
                     ("execute", "c", "fit", "transfer", "bytes"): 100.0,
                     ("execute", "r", "load", "disk-read", "count"): 3.0})
    assert task_counts(tree.spans["r"]) == TaskCounts(
        done=4 + 7, erred=1 + 2, groups_running=1, groups_done=2,
        activity_seconds=1.5, activity_bytes=100.0, total=5 + 7)
    assert isinstance(tree.spans["r"], Span)


def test_an_open_parent_counts_the_tasks_of_its_children_handed_over():
    tree = SpanTree([(0.0, 4)])
    tree.add_span(("r",), ("wf",), 1.0, 0)
    tree.group("r", 1, "load")
    for n in range(3):
        tree.add_span(("r", f"c{n}"), ("wf", "part"), 1.0, 0)
        tree.group(f"c{n}", 2 + n, "fit", ("fit", 1.0, 2.0, 10, 1.0, 7, 1))
        tree.add_deltas({("execute", f"c{n}", "fit", "thread-cpu", "seconds"): 1.5})
    before = task_counts(tree.spans["r"])
    for n in range(2):
        tree.forget(tree.spans[f"c{n}"])
    assert [child.id for child in tree.spans["r"].children] == ["c2"]
    assert task_counts(tree.spans["r"]) == before == TaskCounts(
        done=3 * 6, erred=3, groups_running=1, groups_done=3, activity_seconds=4.5,
        total=3 * 7)


@pytest.fixture
def running_tree() -> SpanTree:
    """``wf`` with a settled group (5 tasks, 1 erred) and, in ``part`` below it, a
    running group not counted yet."""
    tree = SpanTree([(0.0, 4)])
    tree.add_span(("r",), ("wf",), 1.0, 0)
    tree.add_span(("r", "c"), ("wf", "part"), 1.0, 0)
    tree.group("r", 1, "load", ("load", 1.0, 2.0, 10, 1.0, 5, 1))
    tree.group("c", 3, "score")
    return tree


def test_a_running_groups_counts_add_its_tasks_by_state(running_tree):
    tree = running_tree
    # (total, erred, running, waiting): 10 tasks, 3 settled of which 1 erred
    tree.group_counts([("c", 3, 10, 1, 2, 5)])
    counts = task_counts(tree.spans["r"])
    assert (counts.total, counts.done, counts.erred, counts.running, counts.waiting) == (
        5 + 10, 4 + 2, 1 + 1, 2, 5)


def test_errors_seen_count_though_the_groups_counts_forgot_them(running_tree):
    tree = running_tree
    tree.group_erred("c", 3, 2)  # (both released since: settled, not erred)
    tree.group_counts([("c", 3, 10, 0, 2, 5)])
    counts = task_counts(tree.spans["c"])
    assert (counts.done, counts.erred) == (1, 2)


def test_tasks_done_do_not_drop_when_a_task_errs_between_two_counts(running_tree):
    tree = running_tree
    tree.group_counts([("c", 3, 10, 0, 2, 3)])
    done = [task_counts(tree.spans["c"]).done]
    tree.group_erred("c", 3, 1)  # (seen at a tick; the counts come at the sweep)
    done.append(task_counts(tree.spans["c"]).done)
    tree.group_counts([("c", 3, 10, 1, 2, 2)])
    done.append(task_counts(tree.spans["c"]).done)
    assert done == [5, 5, 5]


def test_a_settled_group_is_counted_from_its_figures_not_its_last_counts(running_tree):
    tree = running_tree
    tree.group_counts([("c", 3, 10, 0, 2, 5)])
    tree.group("c", 3, "score", ("score", 1.0, 2.0, 10, 1.0, 10, 0))
    tree.group_counts([("c", 3, 10, 0, 2, 5)])  # (late: changes nothing)
    counts = task_counts(tree.spans["c"])
    assert (counts.total, counts.done, counts.running, counts.waiting) == (10, 10, 0, 0)


def test_a_span_over_gets_one_last_progress_record_at_once_then_none():
    p = live(after=0.0, interval=1.0)
    p.learned("a", ("a",), 100.0, 100.0)
    p.ids_final(["a"])
    assert p.look(101.0, counts).progress
    over = {"a"}
    last = p.look(101.3, counts, lambda span_id: span_id in over).progress
    assert [r.elapsed for r in last] == [pytest.approx(1.3)]
    assert not any(p.look(t, counts, lambda span_id: span_id in over).progress
                   for t in (102.0, 103.0))


def test_a_span_over_before_its_first_progress_gets_no_record():
    p = live(after=10.0, interval=1.0)
    p.learned("a", ("a",), 100.0, 100.0)
    p.ids_final(["a"])
    assert p.look(100.5, counts, lambda span_id: True).progress == []


def test_a_span_that_runs_again_gets_progress_again():
    p = live(after=0.0, interval=1.0)
    p.learned("a", ("a",), 100.0, 100.0)
    p.ids_final(["a"])
    p.look(101.0, counts)
    p.look(101.5, counts, lambda span_id: True)
    assert p.look(102.0, counts).progress


def test_over_means_nothing_runs_and_it_closed_or_is_done():
    running = TaskCounts(groups_running=1)
    assert is_over(TaskCounts(), closed=True, done=False)
    assert is_over(TaskCounts(), closed=False, done=True)
    assert not is_over(TaskCounts(), closed=False, done=False)
    assert not is_over(running, closed=True, done=True)

"""Pure tests of the dask Span -> snapshot -> OTel fields translation, on real
``distributed.spans.Span`` objects with stand-in task groups (no cluster)."""
from __future__ import annotations

import uuid

import pytest
from distributed.spans import Span
from support.stand_ins import Prefix, TaskGroup

from dask_otel_spans import names
from dask_otel_spans.export.traces import (
    SpanSummary,
    active_cpu_seconds,
    span_fields,
    subtree_summary,
    to_ns,
    unseen_span_fields,
)
from dask_otel_spans.protocol.propagation import resolve_chain
from dask_otel_spans.protocol.snapshots import snapshot_span

ROOT = "9cd7531a-e510-4f61-837a-ca1e4437bd90"
CHILD = "0eadd631-e68b-495e-b072-7765d0d61002"


def make_tree():
    history = [(100.0, 4)]
    root = Span(("wf",), ROOT, None, history)
    child = Span(("wf", "load"), CHILD, root, history)
    root.children.append(child)
    root.enqueued = child.enqueued = 100.0
    child.groups.add(
        TaskGroup(Prefix("read"), 101.0, 103.0, 800, 4.0, {"forgotten": 8, "erred": 0})
    )
    child.groups.add(
        TaskGroup(Prefix("read"), 102.0, 104.0, 200, 1.0, {"forgotten": 1, "erred": 1})
    )
    root.groups.add(
        TaskGroup(Prefix("sum"), 104.0, 105.0, 8, 0.5, {"forgotten": 1, "erred": 0})
    )
    child._cumulative_worker_metrics.update(
        {
            ("execute", "read", "thread-cpu", "seconds"): 3.0,
            ("execute", "read", "disk-read", "bytes"): 1000,
            ("p2p", "shuffle", "network", "seconds"): 0.25,
        }
    )
    root._cumulative_worker_metrics.update(
        {("execute", "sum", "thread-cpu", "seconds"): 0.5}
    )
    return root, child


def translation_args(span):
    """Snapshot, ids and summary of a span without known children."""
    snap = snapshot_span(span)
    return snap, resolve_chain([ROOT, CHILD], {}), subtree_summary(snap, {})


def test_subtree_summary_adds_children():
    root, _ = make_tree()
    s = subtree_summary(snapshot_span(root), {})
    assert s.task_count == 11
    assert s.erred_count == 1
    assert s.nbytes_total == 1008
    assert s.task_duration == pytest.approx(5.5)
    assert (s.start, s.stop) == (101.0, 105.0)
    assert s.metrics[("thread-cpu", "seconds")] == pytest.approx(3.5)
    assert s.metrics[("network", "seconds")] == 0.25
    assert s.execute_seconds == pytest.approx(3.5)


def test_subtree_summary_uses_known_child_summaries():
    root, child = make_tree()
    known = {CHILD: SpanSummary(task_count=1000)}
    snap = snapshot_span(root, summarized={CHILD})
    assert snap.children == (CHILD,)
    assert subtree_summary(snap, known).task_count == 1001


def test_snapshot_is_independent_of_later_changes():
    root, child = make_tree()
    snap = snapshot_span(root)
    child._cumulative_worker_metrics[("execute", "read", "thread-cpu", "seconds")] = 99.0
    root.groups.add(
        TaskGroup(Prefix("late"), 106.0, 107.0, 1, 0.1, {"forgotten": 5, "erred": 0})
    )
    s = subtree_summary(snap, {})
    assert s.task_count == 11
    assert s.metrics[("thread-cpu", "seconds")] == pytest.approx(3.5)


def test_a_copy_reads_back_each_field_of_the_span_and_its_groups_by_name():
    """Snapshots are made from their fields in order (no named-tuple ``__new__``):
    each named field holds what its name says."""
    root, child = make_tree()
    snap = snapshot_span(child)
    assert (snap.id, snap.name, snap.enqueued) == (CHILD, ("wf", "load"), 100.0)
    assert snap.metrics == child._cumulative_worker_metrics
    assert (snap.children, snap.code) == ((), ())
    assert snap.nthreads_history is child._total_nthreads_history
    assert snap.nthreads_offset == child._total_nthreads_offset
    by_stop = {g.stop: g for g in snap.groups}
    group = by_stop[104.0]
    assert (group.prefix, group.start, group.stop) == ("read", 102.0, 104.0)
    assert (group.nbytes_total, group.duration) == (200, 1.0)
    assert (group.task_count, group.erred_count) == (2, 1)
    assert snapshot_span(root).children[0] == snap


def test_snapshot_copies_code_only_when_asked():
    root, _ = make_tree()
    root._code[("snippet",)] = None
    assert snapshot_span(root).code == ()
    assert snapshot_span(root, with_code=True).code == (("snippet",),)


def test_summary_matches_distributed_properties():
    root, _ = make_tree()
    s = subtree_summary(snapshot_span(root), {})
    assert s.nbytes_total == root.nbytes_total
    assert s.task_duration == pytest.approx(root.duration)


def test_span_fields_names_times_and_attributes():
    root, child = make_tree()
    summary = subtree_summary(snapshot_span(child), {})
    f = span_fields(
        snapshot_span(child), resolve_chain([ROOT, CHILD], {}), summary,
        now=200.0, complete=True, close_reason=names.CLOSE_REASON_CLIENT,
    )
    assert f.name == "load"
    assert (f.start_ns, f.end_ns) == (to_ns(100.0), to_ns(104.0))
    a = f.attributes
    assert a[names.SPAN_NAME] == ["wf", "load"]
    assert a[names.SPAN_ID] == CHILD
    assert a[names.SPAN_TASK_COUNT] == 10
    assert a[names.SPAN_ERRED_COUNT] == 1
    assert a["dask.metrics.thread-cpu.seconds"] == 3.0
    assert a["dask.metrics.disk-read.bytes"] == 1000
    # 4 threads for 4 seconds, minus 3 known execute seconds
    assert a[names.SPAN_ACTIVE_CPU_SECONDS] == pytest.approx(16.0)
    assert a["dask.metrics.idle or other spans.seconds"] == pytest.approx(13.0)
    assert names.SPAN_INCOMPLETE not in a
    assert f.error == "1 task erred"


def test_prefix_children_merge_groups_of_same_prefix():
    _, child = make_tree()
    f = span_fields(
        *translation_args(child),
        now=200.0, complete=True, close_reason="client",
    )
    assert [p.name for p in f.prefixes] == ["read"]
    p = f.prefixes[0]
    assert (p.start_ns, p.end_ns) == (to_ns(101.0), to_ns(104.0))
    assert p.attributes[names.TASK_GROUP_COUNT] == 2
    assert p.attributes[names.TASK_GROUP_TASK_COUNT] == 10
    assert p.attributes[names.TASK_GROUP_NBYTES_TOTAL] == 1000
    assert p.attributes["dask.metrics.thread-cpu.seconds"] == 3.0
    # p2p keys are not a task prefix
    assert "dask.metrics.network.seconds" not in p.attributes


def test_prefix_spans_can_be_turned_off():
    _, child = make_tree()
    f = span_fields(
        *translation_args(child),
        now=200.0, complete=True, close_reason="client", prefix_spans=False,
    )
    assert f.prefixes == []


def test_incomplete_span_ends_now_and_is_flagged():
    _, child = make_tree()
    f = span_fields(
        *translation_args(child),
        now=150.0, complete=False, close_reason="shutdown",
    )
    assert f.end_ns == to_ns(150.0)
    assert f.attributes[names.SPAN_INCOMPLETE] is True
    assert f.attributes[names.SPAN_CLOSE_REASON] == "shutdown"


def test_code_is_left_out_unless_asked():
    _, child = make_tree()
    f = span_fields(
        *translation_args(child),
        now=150.0, complete=True, close_reason="client",
    )
    assert names.SPAN_CODE not in f.attributes


def test_active_cpu_seconds_follows_cluster_size():
    history = [(0.0, 2), (10.0, 4), (20.0, 1)]
    assert active_cpu_seconds(history, 0, 5.0, 25.0) == pytest.approx(
        5 * 2 + 10 * 4 + 5 * 1
    )
    assert active_cpu_seconds(history, 1, 12.0, 15.0) == pytest.approx(12.0)
    assert active_cpu_seconds(history, 0, 5.0, 5.0) == 0.0


def test_active_cpu_seconds_matches_distributed():
    history = [(0.0, 2), (10.0, 4), (20.0, 1)]
    span = Span(("x",), ROOT, None, history)
    span.enqueued = 5.0
    span._total_nthreads_offset = 0
    span.groups.add(TaskGroup(Prefix("p"), 6.0, 25.0))
    assert active_cpu_seconds(history, 0, 5.0, span.stop) == pytest.approx(
        span.active_cpu_seconds
    )


def test_unseen_span_takes_client_times():
    f = unseen_span_fields(
        ("wf", "nothing"), CHILD, resolve_chain([ROOT, CHILD], {}),
        enter=10.0, exit=12.5, close_reason="client",
    )
    assert f.name == "nothing"
    assert (f.start_ns, f.end_ns) == (to_ns(10.0), to_ns(12.5))
    assert f.attributes[names.SPAN_TASK_COUNT] == 0
    assert f.prefixes == []


def test_a_copy_holds_its_children_and_their_groups_and_metrics():
    root, _ = make_tree()
    snap = snapshot_span(root)
    assert [g.prefix for g in snap.groups] == ["sum"]
    [copied_child] = snap.children
    assert copied_child.id == CHILD
    assert sorted(g.task_count for g in copied_child.groups) == [2, 8]
    assert copied_child.metrics[("execute", "read", "thread-cpu", "seconds")] == 3.0


def test_a_prefix_span_and_its_dask_span_cover_an_erred_task_that_ended_later():
    from dask_otel_spans.export.traces import SpanSummary, span_fields
    from dask_otel_spans.protocol.snapshots import GroupSnapshot, SpanSnapshot
    from dask_otel_spans.protocol.tasks import TaskRecord

    group = GroupSnapshot("f", 1.0, 2.0, 0, 0.5, 2, 1)  # (the erred task not in stop)
    erred = TaskRecord("f-1", "tcp://w:1", 1.5, 3.0, -1, (), "ValueError('x')", "")
    snap = SpanSnapshot("s" * 32, ("wf",), 0.5, (group,), {}, (), (), [(0.0, 1)], 0,
                        {"f": ([erred], 0)})
    summary = SpanSummary(task_count=2, erred_count=1, start=1.0, stop=2.0)
    ids = resolve_chain([str(uuid.uuid4())], {})
    fields = span_fields(snap, ids, summary, now=10.0, complete=True,
                         close_reason="client")
    (prefix,) = fields.prefixes
    assert prefix.tasks[0].end_ns == 3_000_000_000
    assert prefix.end_ns == 3_000_000_000 and fields.end_ns == 3_000_000_000


def tree_with_an_erred_group(*settles: tuple[float, ...]):
    """A span tree copy with one span, enqueued at 100, and one group of prefix
    ``f`` settled with each ``done`` message's figures in ``settles`` in turn."""
    from dask_otel_spans.export.tracking.tree import SpanTree

    tree = SpanTree([(100.0, 4)])
    tree.add_span([ROOT], ("wf",), 100.0, 0)
    tree.group_erred(ROOT, 1, 1)
    for figures in settles:
        tree.group(ROOT, 1, "f", figures)
    return tree.spans[ROOT]


def test_a_prefix_span_of_an_erred_task_takes_the_tasks_compute_times():
    # (task-spans none: no task record; dask's group has no start or stop)
    span = tree_with_an_erred_group(("f", 0.0, 0.0, 0, 0.0, 1, 1, 101.0, 101.5))
    snap, ids, summary = translation_args(span)
    f = span_fields(snap, ids, summary, now=130.0, complete=True,
                    close_reason="client")
    (prefix,) = f.prefixes
    assert (prefix.start_ns, prefix.end_ns) == (to_ns(101.0), to_ns(101.5))
    assert (f.start_ns, f.end_ns) == (to_ns(100.0), to_ns(101.5))


def test_a_prefix_span_covers_its_erred_tasks_and_those_that_finished():
    span = tree_with_an_erred_group(("f", 102.0, 103.0, 8, 1.0, 3, 1, 101.0, 104.0))
    f = span_fields(*translation_args(span), now=130.0, complete=True,
                    close_reason="client")
    (prefix,) = f.prefixes
    assert (prefix.start_ns, prefix.end_ns) == (to_ns(101.0), to_ns(104.0))
    assert f.end_ns == to_ns(104.0)


def test_a_group_settled_again_keeps_the_times_of_its_earlier_erred_tasks():
    span = tree_with_an_erred_group(
        ("f", 0.0, 0.0, 0, 0.0, 1, 1, 101.0, 101.5),
        ("f", 106.0, 107.0, 8, 1.0, 2, 1, 0.0, 0.0),  # (a task of it ran again)
    )
    (group,) = snapshot_span(span).groups
    assert (group.start, group.stop) == (101.0, 107.0)


def test_the_description_names_the_three_most_frequent_error_types_and_counts_the_rest():
    from dask_otel_spans.export.traces import SpanSummary, error_description, error_type

    summary = SpanSummary(erred_count=12, errors={
        "ValueError": 5, "KeyError": 3, "a.B": 2, "OSError": 1, "x.Y": 1})
    assert error_type(summary) == "ValueError"
    assert error_description(summary) == (
        "12 tasks erred: 5 ValueError, 3 KeyError, 2 a.B, 2 of 2 other types")


def test_erred_work_of_no_known_exception_type_is_other():
    from dask_otel_spans.export.traces import SpanSummary, error_type

    assert error_type(SpanSummary(erred_count=2)) == "_OTHER"
    assert error_type(SpanSummary()) is None

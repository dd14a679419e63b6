"""Whether an open span's tree is done, and when its last task finished: worked out
once per span per pass from its own task groups, its open children and what its
handed-over children left in its record; never the whole history of the tree."""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from dask_otel_spans.protocol.dask_facts import group_done

if TYPE_CHECKING:
    from dask_otel_spans.export.tracking.records import OpenSpan


class Verdicts:
    """The verdicts of one pass over the open spans ``records``: each span's is
    worked out once and reused by its ancestors' checks.

    Parameters
    ----------
    records:
        span id -> :class:`~dask_otel_spans.export.tracking.records.OpenSpan`, of the
        spans not handed over yet

    Notes
    -----
    The records it judges are of spans the scheduler saw (``rec.span`` set: the
    callers look first); the lines that read ``rec.span`` say so to mypy.
    """

    def __init__(self, records: Mapping[str, OpenSpan]):
        self.records = records
        self.done: dict[str, bool] = {}
        self.finished: dict[str, float] = {}

    def open_with_tasks(self, ids: list[str]) -> Iterator[OpenSpan]:
        """The records of the spans of ``ids`` still open and seen by the
        scheduler; an handed over child counts as done, its finish time is in its
        parent's record."""
        records = self.records
        for dask_id in ids:
            rec = records.get(dask_id)
            if rec is not None and rec.span is not None:
                yield rec

    def is_done(self, rec: OpenSpan) -> bool:
        """``Span.done``, taking handed-over children as done and open closed children
        as not done yet (they are handed over first, and their emission queues this
        span again)."""
        cached = self.done.get(rec.id)
        if cached is not None:
            return cached
        out = self._is_done(rec)
        self.done[rec.id] = out
        return out

    def _is_done(self, rec: OpenSpan) -> bool:
        if (not rec.span.groups and not rec.span.children  # type: ignore[union-attr]
                and not rec.children_handed_over):
            # distributed makes a span with its first task group (or as the parent
            # of one that has it): this one's group is on its way
            return False
        if not self.own_groups_done(rec):
            return False
        if not rec.open_children:
            rec.unfinished_child = None
            return True
        if not self._unfinished_child_done(rec):
            return False
        for child in self.open_with_tasks(list(rec.open_children)):
            # a closed child: its own checks hand it over once done, no later than this
            # span can be ready; until then this span waits for it, with no walk
            # of its waiting siblings pass after pass
            if child.closed_at is not None or not self.is_done(child):
                rec.unfinished_child = child.id
                return False
        rec.unfinished_child = None
        return True

    def _unfinished_child_done(self, rec: OpenSpan) -> bool:
        """Whether the open child found not done by the last check of ``rec`` is done
        by now (True when there is none): while it runs, a check of ``rec`` need not
        walk its other children."""
        child_id = rec.unfinished_child
        if child_id is None or child_id not in rec.open_children:
            return True
        child = self.records.get(child_id)
        if child is None or child.span is None:
            return True
        if child.closed_at is not None:
            return False
        return self.is_done(child)

    @staticmethod
    def own_groups_done(rec: OpenSpan) -> bool:
        """Whether the span's own task groups are done: the group found unfinished
        last time first (O(1) while it runs)."""
        unfinished = rec.unfinished_group
        if unfinished is not None:
            if not group_done(unfinished):
                return False
            rec.unfinished_group = None
            if len(rec.span.groups) == 1:  # type: ignore[union-attr]
                return True  # (that group: groups are only ever added)
        for tg in rec.span.groups:  # type: ignore[union-attr]
            if not group_done(tg):
                rec.unfinished_group = tg
                return False
        return True

    def finished_at(self, rec: OpenSpan) -> float:
        """When the last task of a done span tree finished (0 without tasks): its
        own groups, its open children, and what its handed-over children left in the
        record."""
        cached = self.finished.get(rec.id)
        if cached is not None:
            return cached
        out = max((tg.stop for tg in rec.span.groups), default=0.0)  # type: ignore[union-attr]
        out = max(out, rec.children_finished_at)
        if rec.open_children:
            for child in self.open_with_tasks(list(rec.open_children)):
                out = max(out, self.finished_at(child))
        self.finished[rec.id] = out
        return out

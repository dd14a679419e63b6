"""The span tree copy: the scheduler's dask spans rebuilt from the forwarder's
messages, as real ``distributed.spans.Span`` objects with task groups that stand in
for the scheduler's (their state counts and figures as last forwarded).

The copy holds the spans not handed over yet and the span metrics summed from the
heartbeat deltas. A span leaves the copy when it is handed over (the tracker remembers
its tags a while, in :attr:`SpanTree.recent`), and its parent's children with it: an
open parent keeps the task counts of its handed-over descendants as one sum (the ender
keeps their figures as one summary). Memory follows the open spans, not history: a
parent open for a week with a million children handed over holds one sum.
"""
from __future__ import annotations

import logging
from collections.abc import Hashable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

from distributed.spans import Span

from dask_otel_spans.export.tracking.progress import TaskCounts, added, task_counts
from dask_otel_spans.export.tracking.recent import RecentSpans
from dask_otel_spans.export.tracking.samples import PrefixTasks
from dask_otel_spans.protocol.dask_private import (
    code_snippets,
    cumulative_metrics,
    set_nthreads_offset,
)

if TYPE_CHECKING:
    from dask_otel_spans.protocol.events import CodeSnippets
    from dask_otel_spans.protocol.snapshots import DoneFigures, GroupFields

logger = logging.getLogger(__name__)

#: The state counts of a group with a task running (shared: never changed in place)
RUNNING = {"processing": 1}
#: Handed-over children an open parent holds before it sums their task counts (it
#: sums them when asked, or past this many: most parents never are asked, and a
#: parent's memory stays bounded)
SUM_AFTER = 64


class Prefix:
    """Stands in for a ``TaskPrefix``: its name."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name


class TreeGroup:
    """The fields of a ``distributed.scheduler.TaskGroup`` that the tracker and the
    snapshots read, as last forwarded."""

    __slots__ = ("key", "prefix", "span_id", "states", "start", "stop", "duration",
                 "nbytes_total", "erred_seen", "erred_start", "erred_stop", "errors",
                 "counts")

    def __init__(self, key: int, prefix: str, span_id: str):
        #: tells the span's groups apart
        #: (see :func:`~dask_otel_spans.protocol.events.group_running`)
        self.key = key
        self.prefix = Prefix(prefix)
        self.span_id = span_id
        self.states: dict[str, int] = RUNNING
        #: earliest start and latest stop of its tasks' compute, those that erred
        #: included (0 when none reported one)
        self.start = self.stop = self.duration = 0.0
        self.nbytes_total = 0
        #: tasks seen erring (the group's state counts forget an error once the
        #: task is released, as when a client lets erred futures go)
        self.erred_seen = 0
        #: earliest start and latest stop of the compute of its tasks that erred,
        #: over every settle (0 when none reported one)
        self.erred_start = self.erred_stop = 0.0
        #: ``exception.type`` -> tasks of it that erred while they ran
        self.errors: dict[str, int] = {}
        #: while it runs, its tasks ``(total, erred, running, waiting)`` as last
        #: forwarded (the ``counts`` message; erred: at least those seen erring by
        #: then); None when settled or not told yet
        self.counts: tuple[int, int, int, int] | None = None

    def settle(self, figures: DoneFigures | GroupFields) -> None:
        """Take the figures of a ``done`` message
        (:func:`~dask_otel_spans.protocol.snapshots.done_figures`; without the erred window
        at their end, no task of it erred since it was last done). ``start`` and
        ``stop`` cover its erred tasks' compute too: dask's count the tasks that
        finished only."""
        prefix, start, stop, nbytes_total, duration, task_count, erred, *window = (
            figures
        )
        if window and window[1]:
            first, last = window[0], window[1]
            if not self.erred_stop or first < self.erred_start:
                self.erred_start = first
            self.erred_stop = max(self.erred_stop, last)
        if self.erred_stop:
            if not start or self.erred_start < start:
                start = self.erred_start
            stop = max(stop, self.erred_stop)
        self.prefix = Prefix(str(prefix))
        self.start, self.stop, self.duration = start, stop, duration
        self.nbytes_total = nbytes_total
        erred = min(task_count, max(erred, self.erred_seen))
        self.states = {"memory": task_count - erred, "erred": erred}
        self.counts = None


class TreeSpan(Span):
    """A ``distributed.spans.Span`` of the copy, which holds its parent (the copy
    forgets handed over spans, which a weak reference would then lose while a child
    is open) until the parent is forgotten."""

    __slots__ = ("_parent_span", "task_samples", "_gone", "_gone_counts")
    _parent_span: Span | None
    #: prefix -> the tasks of its own groups that get task spans
    task_samples: dict[str, PrefixTasks]
    #: children handed over (no longer among its children) whose task counts are not
    #: summed yet, and the sum of the others'
    _gone: list[TreeSpan]
    _gone_counts: TaskCounts | None
    #: its groups are the copy's stand-ins for the scheduler's ``TaskGroup``
    #: (with the fields that ``Span``'s properties read), its children and
    #: descendants spans of the copy (:meth:`SpanTree.add_span`)
    groups: set[TreeGroup]  # type: ignore[assignment]
    children: list[TreeSpan]  # type: ignore[assignment]

    if TYPE_CHECKING:
        def traverse_spans(self) -> Iterator[TreeSpan]: ...

    @property
    def parent(self) -> Span | None:
        return self._parent_span

    @property
    def handed_over_counts(self) -> TaskCounts | None:
        """The task counts of its descendants handed over (and so no longer among its
        children), summed; None when none was."""
        if self._gone:
            self._sum_gone()
        return self._gone_counts

    def _sum_gone(self) -> None:
        gone, self._gone = self._gone, []
        total = self._gone_counts
        for child in gone:
            counts = task_counts(child)
            total = counts if total is None else added(total, counts)
        self._gone_counts = total


class SpanTree:
    """The span tree as forwarded.

    Parameters
    ----------
    nthreads_history:
        The scheduler's ``total_nthreads_history`` (in process), or the session's
        copy of it, which the spans refer to
    max_task_spans:
        The most task spans per prefix per span (``max-task-spans``)
    slowest_tasks:
        Whether the finished tasks kept are the slowest (``task-spans: slowest``)
        rather than the first (``all``)
    """

    def __init__(self, nthreads_history: list[tuple[float, int]],
                 max_task_spans: int = 0, slowest_tasks: bool = False):
        self.history = nthreads_history
        self.max_task_spans = max_task_spans
        self.slowest_tasks = slowest_tasks
        #: span id -> Span, of the spans not handed over yet
        self.spans: dict[str, TreeSpan] = {}
        #: (span id, group key) -> group, of the spans in ``spans``
        self.groups: dict[tuple[str, int], TreeGroup] = {}
        #: span id -> its chain of ids, root first (an ancestor may have left)
        self.chains: dict[str, tuple[str, ...]] = {}
        #: the spans handed over lately (the readiness tracker remembers them
        #: there), whose tags heartbeat deltas that come late read
        self.recent = RecentSpans()
        self.n_workers = 0
        #: spans added to the copy
        self.received = 0
        #: the highest place in the scheduler's span dict of a span added here
        self.last_position = -1
        #: span id -> its place in the scheduler's span dict, of the spans in
        #: ``spans`` whose place came; the places of those handed over since the last
        #: :meth:`take_handed_over` (the export process says them to the scheduler)
        self.places: dict[str, int] = {}
        self._handed_over: list[int] = []
        self.tags = _Tags(self)

    def add_span(self, ids: tuple[str, ...], name: Iterable[str], enqueued: float, offset: int,
                 position: int = -1) -> TreeSpan | None:
        """Add a span; None when it is in the copy already (adopted again)."""
        ids = tuple(ids)
        span_id = ids[-1]
        if position > self.last_position:
            self.last_position = int(position)
        if position >= 0:
            self.places[span_id] = int(position)
        if span_id in self.spans:
            return None
        parent = self.spans.get(ids[-2]) if len(ids) > 1 else None
        history = self.history or [(enqueued, 0)]
        span = TreeSpan(tuple(name), span_id, parent, history)
        span._parent_span = parent
        span.task_samples = {}
        span._gone = []
        span._gone_counts = None
        span.enqueued = enqueued
        set_nthreads_offset(span, offset)
        if parent is not None:
            parent.children.append(span)
        self.spans[span_id] = span
        self.chains[span_id] = ids
        self.received += 1
        return span

    def group(self, span_id: str, key: int, prefix: str,
              figures: DoneFigures | GroupFields | None = None) -> TreeGroup | None:
        """A task group of a span runs (``figures`` None) or settled; None when the
        span was handed over already (a late settle changes nothing)."""
        span = self.spans.get(span_id)
        if span is None:
            return None
        tg = self.groups.get((span_id, key))
        if tg is None:
            tg = self.groups[span_id, key] = TreeGroup(key, str(prefix), span_id)
            span.groups.add(tg)
        if figures is None:
            tg.states = RUNNING
        else:
            tg.settle(figures)
        return tg

    def group_counts(self, entries: Iterable[tuple[str, int, int, int, int, int]]) -> None:
        """The tasks by state of running groups (the ``counts`` message's entries:
        ``(span id, group key, total, erred, running, waiting)``); an entry of a
        group not in the copy, or settled, changes nothing. The errors seen by then
        count (dask's counts forget an error once its task is released); those seen
        later wait for the next counts, which say which tasks settled meanwhile (so
        that the tasks done never drop)."""
        groups = self.groups
        for span_id, key, total, erred, running, waiting in entries:
            tg = groups.get((span_id, key))
            if tg is not None and tg.states is RUNNING:
                tg.counts = (int(total), max(int(erred), tg.erred_seen), int(running),
                             int(waiting))

    def group_erred(self, span_id: str, key: int, count: int,
                    types: Iterable[tuple[str, int]] = ()) -> None:
        """``count`` more tasks of a group erred, ``types`` of them (``(exception.type,
        count)``) while they ran (the group is made if it is new: it errs before it
        settles)."""
        span = self.spans.get(span_id)
        if span is None:
            return
        tg = self.groups.get((span_id, key))
        if tg is None:
            tg = self.group(span_id, key, "")
            assert tg is not None  # (its span is in the copy)
        tg.erred_seen += count
        errors = tg.errors
        for kind, n in types:
            errors[kind] = errors.get(kind, 0) + n

    def add_tasks(self, span_id: str, prefix: str, records: Iterable[tuple[object, ...]],
                  erred_seen: int,
                  others_seen: int) -> None:
        """Tasks of a group of the span chosen for task spans, merged into its
        prefix's under the cap (nothing when the span was handed over already)."""
        span = self.spans.get(span_id)
        if span is None:
            return
        tasks = span.task_samples.get(prefix)
        if tasks is None:
            tasks = span.task_samples[prefix] = PrefixTasks(
                self.max_task_spans, self.slowest_tasks
            )
        tasks.add(records, erred_seen, others_seen)

    def add_metrics(self, span_id: str, metrics: Mapping[Hashable, float]) -> None:
        span = self.spans.get(span_id)
        if span is not None:
            cumulative_metrics(span).update(metrics)

    def add_code(self, span_id: str, code: CodeSnippets) -> None:
        span = self.spans.get(span_id)
        if span is not None:
            for snippets in code:
                code_snippets(span)[tuple(snippets)] = None

    def add_deltas(self, deltas: Mapping[Hashable, float]) -> None:
        """Heartbeat deltas ``{(context, span_id, prefix, activity, unit): value}``,
        summed into the spans' metrics (as ``SpansSchedulerExtension.heartbeat``
        does); a key that is not of that shape is skipped."""
        spans = self.spans
        context: Hashable
        span_id: str
        other: list[Hashable]
        for key, value in deltas.items():
            try:
                # (a key from a worker's heartbeat: dask's are tuples; one of
                # another shape is skipped)
                context, span_id, *other = key  # type: ignore[misc]
            except (TypeError, ValueError):
                continue
            span = spans.get(span_id)
            if span is not None:
                own_key = (context, *other)
                cumulative_metrics(span)[own_key] += value

    def forget(self, span: Span) -> None:
        """An handed over span leaves the copy, and its parent's children: an open
        parent adds its task counts to those of its handed-over descendants.
        (``span`` as the readiness tracker hands it back: a span of the copy.)"""
        span_id = span.id
        if self.spans.get(span_id) is not span:
            return
        del self.spans[span_id]
        parent = span.parent
        if isinstance(parent, TreeSpan) and self.spans.get(parent.id) is parent:
            _detach(parent, span)
        self.chains.pop(span_id, None)
        place = self.places.pop(span_id, None)
        if place is not None:
            self._handed_over.append(place)
        for child in span.children:
            # (no reference cycle is left: it goes when its parent forgets it)
            child._parent_span = None
        for tg in span.groups:
            self.groups.pop((span_id, tg.key), None)

    def take_handed_over(self) -> list[int]:
        """The places of the spans handed over since the last call."""
        places, self._handed_over = self._handed_over, []
        return places

    def chain_of(self, span: Span) -> tuple[str, ...]:
        """The ids of ``span`` and its ancestors, root first."""
        return self.chains.get(span.id) or (span.id,)


def _detach(parent: TreeSpan, child: TreeSpan) -> None:
    """Take a handed-over ``child`` out of ``parent``'s children, to be summed into
    its parent's handed-over task counts (its tree's, and its own handed-over
    descendants')."""
    children = parent.children
    # (the oldest first, most often: they are handed over in about the order made)
    for i, other in enumerate(children):
        if other is child:
            del children[i]
            break
    child._parent_span = None  # (no reference cycle while it waits to be summed)
    parent._gone.append(child)
    if len(parent._gone) >= SUM_AFTER:
        parent._sum_gone()


class _Tags(Mapping):
    """Span id -> tags, of the spans in the copy and of those handed over lately."""

    __slots__ = ("_tree",)

    def __init__(self, tree: SpanTree):
        self._tree = tree

    def __getitem__(self, span_id: str) -> tuple[str, ...]:
        span = self._tree.spans.get(span_id)
        if span is not None:
            return tuple(span.name)
        return self._tree.recent.tags(span_id)

    def __iter__(self) -> Iterator[str]:
        return iter(self._tree.spans)

    def __len__(self) -> int:
        return len(self._tree.spans)

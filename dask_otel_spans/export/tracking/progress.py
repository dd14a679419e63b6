"""Live progress bookkeeping: which open dask spans are due a ``dask.span.started``
record, and which a ``dask.span.progress`` record, at each look, from the session's
events and a clock.

Pure policy: no OTel, no threads, no clock of its own. The export session feeds it
(:meth:`LiveProgress.learned`, :meth:`LiveProgress.ids_final`,
:meth:`LiveProgress.ended`), asks it at each pass (:meth:`LiveProgress.look`) and
makes what it says (:mod:`dask_otel_spans.export.live`).

What is counted (:func:`task_counts`), over the span's tree: the tasks of its groups
by state. A settled group's come with its ``done`` message; a running group's
(``run``) with ``counts`` messages, which the forwarder sends with its first ``run``
and at each sweep (every ``live.interval``, 1 s at most): a sweep old at most, all of
one instant. A task counts as erred once seen erring (dask's counts forget an error
once the task is released), as done when it settled otherwise (finished, released or
forgotten).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from dask_otel_spans.protocol.dask_private import cumulative_metrics

if TYPE_CHECKING:
    from dask_otel_spans.export.tracking.tree import TreeGroup, TreeSpan

#: Progress records per interval at most (the longest-running spans); the others are
#: counted in each record made (``dask.live.spans_not_reported``)
MAX_SPANS_PER_INTERVAL = 50


class TaskCounts(NamedTuple):
    """What the export side knows of a span's tree so far."""

    #: tasks that settled without erring (finished, released or forgotten)
    done: int = 0
    #: tasks that erred (seen erring, in settled and running groups)
    erred: int = 0
    #: task groups with a task not settled (running or waiting), and groups settled
    groups_running: int = 0
    groups_done: int = 0
    #: activity so far (heartbeat deltas): seconds of every ``seconds`` activity, and
    #: bytes of every ``bytes`` one
    activity_seconds: float = 0.0
    activity_bytes: float = 0.0
    #: tasks of the groups submitted so far (``done + erred + running + waiting``),
    #: tasks running (``processing``) and tasks waiting to run (``waiting``,
    #: ``queued``, ``no-worker``)
    total: int = 0
    running: int = 0
    waiting: int = 0


def is_over(counts: TaskCounts, closed: bool, done: bool) -> bool:
    """Whether a span is over as far as its live records go: nothing of its tree
    runs, and its block closed (``closed``) or the readiness tracker judged it done
    (``done``); what is left is its grace period."""
    return not counts.groups_running and (closed or done)


def _group_tasks(tg: TreeGroup) -> tuple[int, int, int, int, int]:
    """A group's tasks ``(total, done, erred, running, waiting)`` (a group of the span
    tree copy: :class:`~dask_otel_spans.export.tracking.tree.TreeGroup`). A running
    group not counted yet (no ``counts`` message) counts its erred tasks only."""
    states = tg.states
    if "processing" not in states:  # (settled: its ``done`` figures)
        erred = states.get("erred", 0)
        done = states.get("memory", 0)
        return (done + erred, done, erred, 0, 0)
    if tg.counts is None:
        return (0, 0, tg.erred_seen, 0, 0)
    total, erred, running, waiting = tg.counts  # (one instant: they add up)
    settled = max(0, total - running - waiting)
    erred = min(settled, erred)
    return (total, settled - erred, erred, running, waiting)


def task_counts(span: TreeSpan) -> TaskCounts:
    """The :class:`TaskCounts` of ``span`` (a span of the span tree copy) and its
    descendants (those handed over as the copy summed them)."""
    sums = [0, 0, 0, 0, 0]  # (total, done, erred, running, waiting)
    groups_running = settled = 0
    seconds = nbytes = 0.0
    handed_over: list[TaskCounts] = []
    for node in span.traverse_spans():
        gone = getattr(node, "handed_over_counts", None)
        if gone is not None:
            handed_over.append(gone)
        for tg in node.groups:
            if "processing" in tg.states:
                groups_running += 1
            else:
                settled += 1
            for i, n in enumerate(_group_tasks(tg)):
                sums[i] += n
        for key, value in cumulative_metrics(node).items():
            unit = key[-1] if isinstance(key, tuple) and key else None
            if unit == "seconds":
                seconds += value
            elif unit == "bytes":
                nbytes += value
    total, done, erred, running, waiting = sums
    out = TaskCounts(done, erred, groups_running, settled, seconds, nbytes, total,
                     running, waiting)
    for gone in handed_over:
        out = added(out, gone)
    return out


def added(counts: TaskCounts, more: TaskCounts) -> TaskCounts:
    """The sum of two :class:`TaskCounts`, field by field."""
    return TaskCounts._make(a + b for a, b in zip(counts, more, strict=True))


class Progress(NamedTuple):
    """One span's progress record, as of one look."""

    span_id: str
    #: seconds since the span was enqueued
    elapsed: float
    counts: TaskCounts


@dataclass
class Look:
    """What is due at one look: in this order, the started records, then the progress
    records (empty lists when nothing is)."""

    started: list[str] = field(default_factory=list)
    progress: list[Progress] = field(default_factory=list)
    #: spans due a progress record that got none (past the bound)
    not_reported: int = 0


@dataclass
class _Open:
    start: float
    chain: tuple[str, ...]
    learned_at: float
    started: bool = False
    ids_final: bool = False
    #: progress records made, and whether the last was the one made when it was over
    reported: int = 0
    final: bool = False


class LiveProgress:
    """Decide the live records of the open spans.

    Parameters
    ----------
    after:
        Seconds a span is open before it gets progress records (``live.after``)
    interval:
        Seconds between two rounds of progress records (``live.interval``); also the
        longest wait of a started record for the span's final ids
    max_spans:
        Progress records per round at most, the longest-running spans first

    Notes
    -----
    A started record waits for the span's ids to be final: a graph that names the
    span or a descendant (its annotation carries the client's contexts, and so the
    trace id), at most ``interval`` after the span was learned of, and never past
    the span's end (:meth:`ended` says that it is still due: it goes first).

    A span that is over (``is_over``: closed, or done and idle, with nothing
    running; it waits only for its grace period before it is exported) gets one last
    progress record at once, when it had some, and no more unless it runs again: so
    the last record says where it stood at its end, and none is made after it. A
    span gets no record once it was handed over. Memory follows the open spans.
    """

    def __init__(self, after: float, interval: float,
                 max_spans: int = MAX_SPANS_PER_INTERVAL):
        self.after = max(0.0, after)
        self.interval = max(1e-3, interval)
        self.max_spans = max(1, max_spans)
        self._open: dict[str, _Open] = {}
        self._next_round: float | None = None
        #: records said due so far
        self.started_count = 0
        self.progress_count = 0

    def __contains__(self, span_id: str) -> bool:
        return span_id in self._open

    def learned(self, span_id: str, chain: Iterable[str], start: float,
                now: float) -> None:
        """The export side learned of a span (``chain``: its ids, root first, its own
        last; ``start``: when it was enqueued). A span learned of again is left as
        it is."""
        if span_id not in self._open:
            self._open[span_id] = _Open(start, tuple(chain), now)
            if self._next_round is None:
                self._next_round = now + self.interval

    def ids_final(self, span_ids: Iterable[str]) -> None:
        """A graph named these spans: their ids, and their ancestors', are final."""
        spans = self._open
        for span_id in span_ids:
            rec = spans.get(span_id)
            if rec is None:
                continue
            for dask_id in rec.chain:
                ancestor = spans.get(dask_id)
                if ancestor is not None:
                    ancestor.ids_final = True

    def ended(self, span_id: str) -> bool:
        """The span was handed over for export; True when its started record is still
        due (to go before the span)."""
        rec = self._open.pop(span_id, None)
        if rec is None or rec.started:
            return False
        self.started_count += 1
        return True

    def look(self, now: float, counts_of: Callable[[str], TaskCounts | None],
             is_over: Callable[[str], bool] = lambda span_id: False) -> Look:
        """The records due at ``now``; ``counts_of`` gives a span's counts (None: the
        span is not reported this time), ``is_over`` whether it is over (it waits for
        its grace period only)."""
        out = Look()
        wait = self.interval
        for span_id, rec in self._open.items():
            if not rec.started and (rec.ids_final or now - rec.learned_at >= wait):
                rec.started = True
                out.started.append(span_id)
            if rec.reported and not rec.final and is_over(span_id):
                rec.final = True  # (its last record, at once)
                self._report(rec, span_id, now, counts_of, out)
        self.started_count += len(out.started)
        if self._next_round is None or now < self._next_round:
            return out
        self._next_round = now + self.interval
        due = []
        for span_id, rec in self._open.items():
            if rec.started and now - rec.start >= self.after:
                if rec.final and not is_over(span_id):
                    rec.final = False  # (it runs again)
                if not rec.final:
                    due.append((rec.start, span_id, rec))
        due.sort(key=lambda item: item[:2])
        for _, span_id, rec in due[:self.max_spans]:
            self._report(rec, span_id, now, counts_of, out)
        out.not_reported = max(0, len(due) - self.max_spans)
        return out

    def _report(self, rec: _Open, span_id: str, now: float,
                counts_of: Callable[[str], TaskCounts | None], out: Look) -> None:
        counts = counts_of(span_id)
        if counts is not None:
            rec.reported += 1
            self.progress_count += 1
            out.progress.append(Progress(span_id, max(0.0, now - rec.start), counts))

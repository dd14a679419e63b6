"""The readiness tracker: decides, from events alone, when each dask span is over
(done, closed, and past its grace period) and hands it over for export.

It knows nothing of where it runs (a thread of the scheduler process, or the export
process): the export session feeds it the forwarder's events and the spans of its
:class:`~dask_otel_spans.export.tracking.tree.SpanTree`, and takes what it hands over.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from distributed.metrics import time

from dask_otel_spans import names
from dask_otel_spans.config import PluginConfig
from dask_otel_spans.export.ender import HandOver
from dask_otel_spans.export.metrics import DaskInstruments, MetricCall
from dask_otel_spans.export.tracking.absorption import CarriedContexts
from dask_otel_spans.export.tracking.notices import NoticeGate
from dask_otel_spans.export.tracking.recent import RecentSpans
from dask_otel_spans.export.tracking.records import (
    OpenSpan,
    carried_for_translation,
    merge_carried,
)
from dask_otel_spans.export.tracking.schedule import CheckSchedule
from dask_otel_spans.export.tracking.verdicts import Verdicts
from dask_otel_spans.logonce import OnceLogger
from dask_otel_spans.protocol.dask_facts import (
    a_running_group,
    grace_period,
    group_done,
)
from dask_otel_spans.protocol.snapshots import snapshot_span

if TYPE_CHECKING:
    from distributed.scheduler import TaskGroup
    from distributed.spans import Span

logger = logging.getLogger(__name__)


class ReadinessTracker:
    """Decide when each open dask span is ready, from the events it is given.

    Parameters
    ----------
    spans:
        span id -> ``Span`` of the span tree copy (the spans not handed over yet)
    chain_of:
        The chain of ids of a span of ``spans``, root first
    config:
        The plugin's settings (export-delay, idle-timeout, lazy-timeout,
        include-code)
    n_workers:
        The number of workers now (the grace period follows it)
    on_handed_over:
        Called with each handed over ``Span`` (the tree forgets it)
    held_until:
        Until when a span otherwise ready waits (for its profiles), None when it
        does not; :meth:`look_again` when that wait is over early
    recent:
        Where the spans handed over are remembered for a while (the tree reads
        the tags of late heartbeats' spans there); default: a memory of its own

    Notes
    -----
    Events: :meth:`add_span`, :meth:`graph`, :meth:`close_notice`,
    :meth:`client_gone`, :meth:`group_done`. :meth:`run_pass` checks the spans
    that changed or whose wait ran out, deepest first, and hands over those ready;
    :meth:`close` hands over every open span. What was handed over is taken with
    :meth:`take`: the metric updates (``(method, args)`` of
    :class:`~dask_otel_spans.export.metrics.DaskInstruments`) and the
    :class:`~dask_otel_spans.export.ender.HandOver` objects, in order.
    """

    def __init__(
        self,
        spans: Mapping[str, Span],
        chain_of: Callable[[Span], tuple[str, ...]],
        config: PluginConfig,
        *,
        n_workers: Callable[[], int] = lambda: 0,
        on_handed_over: Callable[[Span], None] | None = None,
        held_until: Callable[[str], float | None] = lambda span_id: None,
        recent: RecentSpans | None = None,
    ):
        self.spans = spans
        self.chain_of = chain_of
        self.config = config
        self.n_workers = n_workers
        self.on_handed_over = on_handed_over
        self.held_until = held_until
        self._open: dict[str, OpenSpan] = {}
        #: the spans handed over lately (against a second hand-over of one)
        self.recent = recent if recent is not None else RecentSpans()
        self._schedule = CheckSchedule()
        self._metric_calls: list[MetricCall] = []
        self._requests: list[HandOver] = []
        self._log_once = OnceLogger(logger)
        #: the contexts graphs carried, applied to the open spans
        self._carried = CarriedContexts(self._open, spans, self._schedule.look_again,
                                        self._log_once)
        #: close notices read, their times checked, what they open bounded
        self.notices = NoticeGate()
        #: spans handed over for export so far
        self.handed_over = 0
        #: readiness checks made (one per changed or due open span)
        self.readiness_checks = 0

    # -- figures ---------------------------------------------------------------------

    @property
    def open_count(self) -> int:
        """Spans not handed over yet."""
        return len(self._open)

    def record(self, dask_id: str) -> OpenSpan | None:
        """The record of an open span (for tests, diagnostics and exemplars)."""
        return self._open.get(dask_id)

    def pending_wake_ups(self) -> list[float]:
        """When the tracker will look at spans again, whatever changes: the waits
        set (some for spans handed over since) and the waits for graphs."""
        return self._schedule.pending_wake_ups()

    @property
    def grace(self) -> float:
        """The grace period now (:func:`grace_period`)."""
        return grace_period(self.config.export_delay, self.n_workers())

    def take(self) -> tuple[list[MetricCall], list[HandOver]]:
        """The metric updates and the requests handed over since the last call."""
        calls, self._metric_calls = self._metric_calls, []
        requests, self._requests = self._requests, []
        return calls, requests

    # -- events ----------------------------------------------------------------------

    def add_span(self, span: Span, now: float | None = None) -> None:
        """A span of the tree, new or adopted."""
        if span.id in self.recent:
            return
        rec = self._open.get(span.id)
        parent = span.parent
        parent_rec = self._open.get(parent.id) if parent is not None else None
        if rec is None:
            rec = OpenSpan(span.id, tuple(span.name), self.chain_of(span))
            self._open[span.id] = rec
            if parent_rec is not None:
                rec.carried.update(parent_rec.carried)
        else:  # (opened by a close notice, maybe)
            self.notices.seen(span.id)
        if parent_rec is not None:
            parent_rec.open_children.add(span.id)
        rec.span = span
        rec.last_activity = time() if now is None else now
        self._schedule.graph_came(span.id)
        running = a_running_group(span)
        if running is None:
            self._schedule.look_again(rec)
        else:
            # not done: its group's settling sets its check a grace period later
            rec.unfinished_group = running
        if not rec.counted:
            rec.counted = True
            self._metric_calls.append((DaskInstruments.span_opened, (rec.tags,)))

    def group_done(self, span_id: str, stop: float) -> None:
        """Every task of a group of the span settled, the last at ``stop``: look
        again a grace period after that finish."""
        rec = self._open.get(span_id)
        if rec is not None:
            rec.done_since = None
            self._schedule.wake_up_at(rec, stop + self.grace)

    def graph(self, now: float, client: str | None, span_ids: Iterable[str],
              chains: object, links: Iterable[tuple[str, dict[str, str]]] = ()) -> None:
        """A graph reached the scheduler: its tasks' spans saw activity, the W3C
        contexts its annotation carried apply to them, and the spans its bare
        submissions landed in link to their callers (``(span id, W3C headers)``)."""
        if chains:
            self._carried.absorb_chains(chains)
        for span_id, headers in links:
            rec = self._open.get(span_id)
            if rec is not None:
                rec.links.add(headers)
        self._mark_active(span_ids, now, client)

    def carried_again(self, chains: object) -> None:
        """The contexts graphs carried for spans adopted from the scheduler (a new
        export process): :meth:`CarriedContexts.carried_again`."""
        self._carried.carried_again(chains)

    def close_notice(self, now: float, msg: object) -> None:
        """The client helper's block exited (one notice, or a batch of them; as it
        came: :func:`read_notice` checks each)."""
        grace = self.grace
        for notice in msg if isinstance(msg, (list, tuple)) else (msg,):
            try:
                self._on_close_notice(notice, now, grace)
            except Exception:
                self._log_failure("close-notice")

    def client_gone(self, now: float, client: str) -> None:
        """A client left: the helper's spans it alone held open are over."""
        for rec in list(self._open.values()):
            waiting = rec.closed_at is None or (rec.span is None and rec.awaiting_graph)
            if rec.helper and waiting and client in rec.clients:
                rec.clients.discard(client)
                if not rec.clients:
                    rec.client_gone = True
                    rec.last_activity = max(rec.last_activity, now)
                    self._schedule.look_again(rec)

    def look_again(self, span_id: str) -> None:
        """Check the span at the next pass (what it was held for came)."""
        rec = self._open.get(span_id)
        if rec is not None:
            self._schedule.look_again(rec)

    # -- the pass --------------------------------------------------------------------

    def run_pass(self, now: float | None = None) -> None:
        """Check the open spans that changed or whose wait ran out, deepest first
        (children before their parents), and hand over those that are ready."""
        now = time() if now is None else now
        self.recent.expire(now)
        schedule = self._schedule
        schedule.wake_due(now, self._open)
        if not schedule:
            return
        grace = self.grace
        verdicts = Verdicts(self._open)
        while schedule:
            rec = self._open.get(schedule.pop())
            if rec is None:
                continue
            self.readiness_checks += 1
            try:
                ready_at = self._ready_at(rec, now, grace, verdicts)
            except Exception:
                # never drop a span: look again after a grace period
                self._log_failure("readiness")
                ready_at = now + grace
            if ready_at is not None:
                ready_at = max(ready_at, self.held_until(rec.id) or ready_at)
            if ready_at is not None and ready_at <= now:
                try:
                    self._hand_over(rec, now, complete=True, verdicts=verdicts,
                                    grace=grace)
                except Exception:
                    self._log_failure("hand-over")
            elif ready_at is not None:
                self._schedule.wake_up_at(rec, ready_at)

    def close(self, now: float | None = None) -> None:
        """Hand over every open span, complete or not (the scheduler is closing)."""
        now = time() if now is None else now
        verdicts = Verdicts(self._open)
        grace = self.grace
        for rec in sorted(self._open.values(), key=_minus_depth):
            if self._open.get(rec.id) is not rec:
                continue
            if rec.span is None:
                complete = rec.closed_at is not None
            else:
                done = verdicts.is_done(rec)
                complete = done and (rec.closed_at is not None or not rec.helper)
                if rec.closed_at is None:
                    rec.close_reason = names.CLOSE_REASON_SHUTDOWN
            try:
                self._hand_over(rec, now, complete=complete, verdicts=verdicts,
                                grace=grace)
            except Exception:
                self._log_failure("hand-over")

    # -- events, in detail -----------------------------------------------------------

    def _mark_active(self, span_ids: Iterable[str], now: float,
                     client: str | None) -> None:
        """These spans (of new or changed tasks), and their ancestors, saw activity:
        they are not idle."""
        marked: set[str] = set()
        for span_id in span_ids:
            rec = self._open.get(span_id)
            if rec is not None and rec.span is not None and rec.unfinished_group is None:
                # a check is due only if the span may be done already (tasks done
                # before the graph came); else its tasks have it checked
                running = a_running_group(rec.span)
                if running is None:
                    self._schedule.look_again(rec)
                else:
                    rec.unfinished_group = running
            # up the tree, stopping at an ancestor marked already: O(spans)
            node = self.spans.get(span_id)
            while node is not None and node.id not in marked:
                marked.add(node.id)
                node_rec = self._open.get(node.id)
                if node_rec is not None:
                    node_rec.last_activity = now
                    node_rec.done_since = None
                    if client:
                        node_rec.clients.add(client)
                node = node.parent

    def _on_close_notice(self, msg: object, now: float, grace: float) -> None:
        notice = self.notices.read(msg, now)
        if notice is None:
            return
        ids, tags, opened, enter, exit_, carried, lazy, client, _ = notice
        for level in range(len(ids) - opened, len(ids)):
            rec = self._noticed(ids[: level + 1], tags[: level + 1], client, now)
            if rec is None:
                continue
            rec.helper = True
            merge_carried(rec, carried, self._open)
            if client is not None:
                rec.clients.add(client)
            if rec.span is None and lazy:
                rec.awaiting_graph = True
            rec.closed_at = now
            rec.close_reason = names.CLOSE_REASON_CLIENT
            rec.enter, rec.exit = enter, exit_
            if rec.span is not None:
                self._schedule.look_again(rec)
            else:
                wait_until = self._ready_at(rec, now, grace, None)
                if wait_until is not None:
                    self._schedule.wake_up_at(rec, wait_until)

    def _noticed(self, ids: tuple[str, ...], tags: tuple[str, ...],
                 client: str | None, now: float) -> OpenSpan | None:
        """The record a close notice of ``client`` closes (the last of ``ids``),
        opened if need be; None when the notice has nothing to do with it (handed over
        or closed already, or past the notices' bounds)."""
        rec = self._open.get(ids[-1])
        if rec is not None and rec.closed_at is not None:
            self.notices.closed_again(client)
            return None
        if rec is None:
            if ids[-1] in self.spans or ids[-1] in self.recent:
                # handed over lately, or finished before the plugin (a notice later
                # than :class:`RecentSpans` remembers would export its span again:
                # of a block whose graph carried no annotation)
                return None
            if not self.notices.may_open(client, ids[-1], now):
                return None
            rec = self._open[ids[-1]] = OpenSpan(ids[-1], tags, ids)
            if self._carried.submitted_before(ids[-1]):
                rec.submitted = True
        return rec

    # -- readiness -------------------------------------------------------------------

    def _note_done(self, rec: OpenSpan, now: float, leaf_group: TaskGroup | None,
                   verdicts: Verdicts) -> float:
        """The span is done, as this pass first sees: since when (the grace period
        covers heartbeats still in flight: it counts from when the last task
        finished, not from when this pass noticed); its parent may be done now too,
        unless the parent's last check found another child not done (that one
        queues it when done), or this span is closed: its parent waits for its
        hand-over, which queues it. Returns ``done_since``."""
        if leaf_group is None:
            finished = verdicts.finished_at(rec)
        else:
            finished = max(leaf_group.stop, rec.children_finished_at)
            verdicts.finished[rec.id] = finished
        rec.finished_at = finished
        rec.done_since = min(now, finished or now)
        if rec.depth > 1 and rec.closed_at is None:
            parent_rec = self._open.get(rec.ids[-2])
            if parent_rec is not None and (
                parent_rec.unfinished_child is None
                or parent_rec.unfinished_child == rec.id
            ):
                self._schedule.look_again(parent_rec)
        return rec.done_since

    def _unseen_ready_at(self, rec: OpenSpan, grace: float) -> float | None:
        """:meth:`_ready_at` of a span closed by the client and never seen by the
        scheduler (so far). When a graph carried it, its tasks went to another
        span's TaskGroup. When the client said collections built in the block are
        still to be computed, it waits for their graph (lazy-timeout, or until the
        client is gone); otherwise as an idle span."""
        if rec.closed_at is None or rec.id in self.spans:
            return None
        if rec.submitted or rec.client_gone:
            wait = grace
        elif rec.awaiting_graph:
            wait = max(self.config.lazy_timeout, grace)
        else:
            wait = max(self.config.idle_timeout, grace)
        return rec.closed_at + wait

    def _ready_at(self, rec: OpenSpan, now: float, grace: float,
                  verdicts: Verdicts | None) -> float | None:
        """When the span is ready (done, closed and past the grace period): a time
        at or before ``now`` when it is ready now, a later time when only waiting
        is left, None when it waits for an event (tasks, a close notice)."""
        if rec.span is None:
            return self._unseen_ready_at(rec, grace)
        assert verdicts is not None
        groups = rec.span.groups
        leaf_group = None
        if not rec.open_children and len(groups) == 1:
            # one task group and no open child (most spans): its verdict is that
            # group's
            leaf_group = next(iter(groups))
            if not group_done(leaf_group):
                rec.unfinished_group = leaf_group
                rec.done_since = None
                return None
            rec.unfinished_group = rec.unfinished_child = None
            verdicts.done[rec.id] = True
        elif not verdicts.is_done(rec):
            rec.done_since = None
            return None
        done_since = rec.done_since
        if done_since is None:
            done_since = self._note_done(rec, now, leaf_group, verdicts)
        quiet_since = max(done_since, rec.last_activity)
        if rec.closed_at is not None:
            return max(quiet_since, rec.closed_at) + grace
        if rec.helper and not rec.client_gone:
            return None
        ready_at = quiet_since + max(self.config.idle_timeout, grace)
        if ready_at <= now:
            rec.close_reason = (
                names.CLOSE_REASON_CLIENT_GONE if rec.helper else names.CLOSE_REASON_IDLE
            )
        return ready_at

    # -- emission --------------------------------------------------------------------

    def _hand_over(self, rec: OpenSpan, now: float, *, complete: bool,
              verdicts: Verdicts, grace: float) -> None:
        """Copy the span, queue its request, forget the record; its parent learns
        when its tree finished and is looked at again."""
        span = rec.span
        snapshot = None
        finished = rec.finished_at
        if span is not None:
            try:
                # (its handed-over descendants are no longer among its children:
                # the ender holds their summary)
                snapshot = snapshot_span(span, with_code=self.config.include_code)
                if rec.done_since is None:
                    finished = verdicts.finished_at(rec)
            except Exception:
                # exported with what is known (the client's times, or now)
                self._log_once(
                    "error:copy", "cannot copy span %s for export; it is exported "
                    "without its figures (logged once)", rec.id, level=logging.ERROR,
                    exc_info=True,
                )
        del self._open[rec.id]
        self.notices.handed_over(rec.id)
        self._schedule.graph_came(rec.id)
        keep_summary = False
        self.recent.add(rec.id, rec.tags, now, grace)
        if span is not None:
            parent = span.parent
            parent_rec = self._open.get(parent.id) if parent is not None else None
            if parent_rec is not None:
                keep_summary = snapshot is not None
                parent_rec.open_children.discard(span.id)
                parent_rec.children_handed_over += 1
                parent_rec.children_finished_at = max(
                    parent_rec.children_finished_at, finished
                )
                if parent_rec.done_since is None:
                    self._schedule.look_again(parent_rec)
        self.handed_over += 1
        self._requests.append(HandOver(
            rec.tags, rec.ids, carried_for_translation(rec, self._open.get(rec.ids[0])),
            snapshot, now, complete,
            rec.close_reason, rec.enter, rec.exit, keep_summary, rec.counted,
            rec.links.kept(), rec.links.dropped,
        ))
        if span is not None and self.on_handed_over is not None:
            self.on_handed_over(span)

    # -- logging ---------------------------------------------------------------------

    def _log_failure(self, where: str) -> None:
        self._log_once.failure(where)


def _minus_depth(rec: OpenSpan) -> int:
    return -rec.depth

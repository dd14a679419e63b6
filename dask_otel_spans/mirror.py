"""The export process's copy of the scheduler's span tree, rebuilt from what
:mod:`~dask_otel_spans.forwarding` sends, and the plugin's readiness state machine
run on it there, so that the scheduler's event loop does none of that work.

The copy holds the spans not emitted yet (and, for a parent still open, its emitted
children, which its snapshot lists), real ``distributed.spans.Span`` objects with
task groups that stand in for the scheduler's (their state counts and figures as
last forwarded) and the span metrics summed from the heartbeat deltas. A span
leaves the copy when it is emitted: memory follows the open spans, not history.
"""
from __future__ import annotations

import logging
import math
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any

from distributed.spans import Span

from dask_otel_spans.config import PluginConfig
from dask_otel_spans.plugin import _CLIENT_GONE, _NOTICE, _SPANS_GRAPH, OTelSpansPlugin
from dask_otel_spans.wire import span_tags_of

logger = logging.getLogger(__name__)

#: Tags of emitted spans kept for heartbeat deltas that come after the emission
_RECENT_TAGS = 10_000


class _Prefix:
    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name


class MirroredGroup:
    """The fields of a ``distributed.scheduler.TaskGroup`` that the state machine
    and the snapshots read, as last forwarded."""

    __slots__ = ("name", "prefix", "span_id", "states", "start", "stop", "duration",
                 "nbytes_total")

    def __init__(self, name: str, prefix: str, span_id: str):
        self.name = name
        self.prefix = _Prefix(prefix)
        self.span_id = span_id
        self.states: dict[str, int] = _RUNNING
        self.start = self.stop = self.duration = 0.0
        self.nbytes_total = 0

    def settle(self, figures: Any) -> None:
        prefix, start, stop, nbytes_total, duration, task_count, erred = figures
        self.prefix = _Prefix(str(prefix))
        self.start, self.stop, self.duration = start, stop, duration
        self.nbytes_total = nbytes_total
        self.states = {"memory": task_count - erred, "erred": erred}


#: The state counts of a group with a task running (shared: never changed in place)
_RUNNING = {"processing": 1}


class MirroredSpan(Span):
    """A ``distributed.spans.Span`` of the copy, which holds its parent (the copy
    forgets emitted spans, which a weak reference would then lose while a child
    is open) until the parent is forgotten."""

    __slots__ = ("_parent_span",)

    @property
    def parent(self) -> Span | None:
        return self._parent_span


class _Workers:
    """Stands in for the scheduler's worker dict: its length only."""

    def __init__(self) -> None:
        self.n = 0

    def __len__(self) -> int:
        return self.n


class _MirroredScheduler:
    def __init__(self) -> None:
        self.workers = _Workers()
        self.tasks: dict[Any, Any] = {}


class _MirroredExtension:
    def __init__(self) -> None:
        #: span id -> Span, of the spans not emitted yet
        self.spans: dict[str, Span] = {}


class _Tracker(OTelSpansPlugin):
    """The plugin's state machine on the copy: registers spans as they come (not by
    position in the extension's dict: emitted ones leave it), and lets the copy
    forget each span it emits."""

    def __init__(self, mirror: SpanMirror, config: PluginConfig):
        super().__init__(use_global_providers=False)
        self.config = config
        self._mirror = mirror
        # (spans are registered by the copy as they come)
        self._n_known = math.inf

    def _chain_of(self, span: Span) -> tuple[str, ...]:
        return self._mirror.chains.get(span.id) or super()._chain_of(span)

    def _queue_request(self, rec: Any, now: float, complete: bool,
                       snapshot: Any) -> None:
        super()._queue_request(rec, now, complete, snapshot)
        if rec.span is not None:
            self._mirror.forget(rec.span)
            self._remember(self._unseen_emitted, rec.id)


class SpanMirror:
    """The span tree as forwarded, and the state machine that emits its spans.

    Parameters
    ----------
    emitter:
        Where emitted spans go (a :class:`~dask_otel_spans.emitter.SpanEmitter`)
    pump:
        Where metric updates go (a :class:`~dask_otel_spans.metrics.MetricsPump`),
        or None
    nthreads_history:
        The copy of the scheduler's ``total_nthreads_history`` that the spans
        refer to
    config:
        The plugin's settings
    """

    def __init__(self, emitter: Any, pump: Any,
                 nthreads_history: list[tuple[float, int]], config: PluginConfig):
        self.history = nthreads_history
        self.scheduler = _MirroredScheduler()
        self.ext = _MirroredExtension()
        self.spans = self.ext.spans
        #: (span id, group name) -> group, of the spans in ``spans``
        self.groups: dict[tuple[str, str], MirroredGroup] = {}
        #: span id -> its chain of ids, root first (an ancestor may have left)
        self.chains: dict[str, tuple[str, ...]] = {}
        #: tags of spans emitted lately, for heartbeat deltas that come late
        self.recent_tags: OrderedDict[str, tuple[str, ...]] = OrderedDict()
        self.tracker = tracker = _Tracker(self, config)
        tracker.scheduler = self.scheduler
        tracker._ext = self.ext
        tracker._tasks = self.scheduler.tasks
        tracker.emitter = emitter
        tracker.pump = pump
        tracker._started = True
        self._logged: set[str] = set()
        #: spans forwarded to the copy (not again)
        self.received = 0
        #: the highest place in the scheduler's span dict of a span forwarded here
        #: (after a restart, the scheduler forwards again the spans past the one
        #: the process that died reported)
        self.last_position = -1

    # -- what the scheduler forwards -------------------------------------------------

    def apply(self, items: list[tuple[Any, ...]]) -> None:
        """Structural messages: spans, task groups, metrics of adopted spans, the
        number of workers."""
        for item in items:
            try:
                kind = item[0]
                if kind == "span":
                    self._add_span(*item[1:])
                elif kind == "run":
                    self._group(item[1], item[2], item[3], None)
                elif kind == "done":
                    self._group(item[1], item[2], item[3][0], item[3])
                elif kind == "metrics":
                    span = self.spans.get(item[1])
                    if span is not None:
                        span._cumulative_worker_metrics.update(item[2])
                elif kind == "workers":
                    self.scheduler.workers.n = int(item[1])
            except Exception:
                self._log_once("apply", "ignoring a forwarded message it cannot read: "
                               "%.200r", item)

    def apply_events(self, events: list[tuple[Any, ...]]) -> None:
        """Hook events, queued for the state machine's next pass as the plugin's
        hooks queue them."""
        pending = self.tracker._pending
        for event in events:
            try:
                kind = event[0]
                if kind == "graph":
                    _, now, client, span_ids, chains = event
                    otel = dict(enumerate(chains)) if type(chains) is list else chains
                    pending.append((_SPANS_GRAPH, 0, now, client, span_ids, otel))
                elif kind == "notice":
                    pending.append((_NOTICE, 0, event[1], event[2]))
                elif kind == "client-gone":
                    pending.append((_CLIENT_GONE, 0, event[1], event[2]))
            except Exception:
                self._log_once("event", "ignoring a forwarded event it cannot read: "
                               "%.200r", event)

    def add_deltas(self, deltas: Mapping[Any, float]) -> tuple[Any, ...] | None:
        """Heartbeat deltas ``{(context, span_id, prefix, activity, unit): value}``:
        summed into the spans' metrics (as ``SpansSchedulerExtension.heartbeat``
        does); the metric update to make of them, with the spans' tags."""
        spans = self.spans
        for key, value in deltas.items():
            try:
                context, span_id, *other = key
                span = spans.get(span_id)
                if span is not None:
                    span._cumulative_worker_metrics[(context, *other)] += value
            except Exception:
                self._log_once("deltas", "ignoring a metric delta it cannot read: "
                               "%.200r", key)
        return ("add_span_deltas", (deltas, span_tags_of(deltas, _Tags(self))))

    def _add_span(self, ids: Any, name: Any, enqueued: float, offset: int,
                  position: int = -1) -> None:
        ids = tuple(ids)
        span_id = ids[-1]
        if position > self.last_position:
            self.last_position = int(position)
        if span_id in self.spans:
            return  # (adopted again by a new plugin instance)
        parent = self.spans.get(ids[-2]) if len(ids) > 1 else None
        history = self.history or [(enqueued, 0)]
        span = MirroredSpan(tuple(name), span_id, parent, history)
        span._parent_span = parent
        span.enqueued = enqueued
        span._total_nthreads_offset = offset
        if parent is not None:
            parent.children.append(span)
        self.spans[span_id] = span
        self.chains[span_id] = ids
        self.received += 1
        self.tracker._register(span)

    def _group(self, span_id: str, name: str, prefix: str, figures: Any) -> None:
        span = self.spans.get(span_id)
        if span is None:
            return  # emitted already: a late settle changes nothing
        tg = self.groups.get((span_id, name))
        if tg is None:
            tg = self.groups[span_id, name] = MirroredGroup(name, str(prefix), span_id)
            span.groups.add(tg)
        if figures is None:
            tg.states = _RUNNING
            return
        tg.settle(figures)
        tracker = self.tracker
        rec = tracker._open.get(span_id)
        if rec is not None:
            # As the plugin's transition hook: look again a grace period after the
            # group's last task finished (not after the message came: it ran late
            # by up to a tick of each process). The check judges it done from then.
            rec.done_since = None
            tracker._wake_up_at(rec, tg.stop + tracker.grace)

    def forget(self, span: Span) -> None:
        """An emitted span leaves the copy (its parent's list of children keeps it
        while the parent is open); its tags stay a while for late deltas."""
        span_id = span.id
        if self.spans.get(span_id) is not span:
            return
        del self.spans[span_id]
        self.chains.pop(span_id, None)
        for child in span.children:
            # (no reference cycle is left: it goes when its parent forgets it)
            child._parent_span = None
        for tg in span.groups:
            self.groups.pop((span_id, tg.name), None)
        recent = self.recent_tags
        recent[span_id] = tuple(span.name)
        while len(recent) > _RECENT_TAGS:
            recent.popitem(last=False)

    # -- the state machine -----------------------------------------------------------

    def run_pass(self) -> None:
        """Take in the queued events, check the spans that changed or whose wait ran
        out, and emit those that are ready (the plugin's periodic pass, in one go)."""
        tracker = self.tracker
        with tracker._guard("tick"):
            try:
                for _ in tracker._one_pass():
                    pass
            finally:
                tracker._deliver()

    def close(self) -> None:
        """Emit every open span, complete or not (the scheduler is closing)."""
        tracker = self.tracker
        with tracker._guard("close"):
            tracker._emit_all_at_shutdown()

    def stats(self) -> dict[str, Any]:
        tracker = self.tracker
        return {
            "open": len(tracker._open),
            "handed_over": tracker.handed_over_count,
            "received": self.received,
            "last_position": self.last_position,
            "readiness_checks": tracker.readiness_checks,
            "mirrored_spans": len(self.spans),
        }

    def _log_once(self, kind: str, msg: str, *args: Any) -> None:
        if kind not in self._logged:
            self._logged.add(kind)
            logger.warning("dask_otel_spans: " + msg + " (logged once)", *args)


class _Tags(Mapping):
    """Span id -> tags, of the spans in the copy and of those emitted lately."""

    __slots__ = ("_mirror",)

    def __init__(self, mirror: SpanMirror):
        self._mirror = mirror

    def __getitem__(self, span_id: str) -> tuple[str, ...]:
        span = self._mirror.spans.get(span_id)
        if span is not None:
            return tuple(span.name)
        return self._mirror.recent_tags[span_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._mirror.spans)

    def __len__(self) -> int:
        return len(self._mirror.spans)

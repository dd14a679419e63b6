"""The forwarder: the only plugin code on the scheduler's event loop besides the
hooks. It reads what changed since the last tick (new spans, the hooks' queued events,
task groups that started or settled, heartbeat deltas) and sends it as messages of
the protocol (:mod:`~dask_otel_spans.protocol.events`) to the transport, keeping no state of
the spans: work proportional to what changed, in steps that the plugin runs in
slices of the plugin's tick budget.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Container, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import islice
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from distributed.metrics import time

from dask_otel_spans import names
from dask_otel_spans.protocol import events
from dask_otel_spans.protocol.dask_facts import group_done
from dask_otel_spans.protocol.dask_private import code_snippets
from dask_otel_spans.protocol.events import Message
from dask_otel_spans.protocol.snapshots import done_figures
from dask_otel_spans.protocol.tasks import NONE
from dask_otel_spans.scheduler.adoption import adopt_spans
from dask_otel_spans.scheduler.counts import (
    COUNTS_INTERVAL,
    Counts,
    CountsSweep,
    Entry,
    note_counts,
)
from dask_otel_spans.scheduler.graphs import (
    collect_links,
    collect_span_ids,
    distinct_chains,
    large,
)
from dask_otel_spans.scheduler.sampler import TaskSampler
from dask_otel_spans.scheduler.span_message import chain_ids as chain_ids  # (public here)
from dask_otel_spans.scheduler.span_message import span_message

if TYPE_CHECKING:
    from dask.typing import Key
    from distributed.scheduler import TaskGroup, TaskState
    from distributed.spans import Span

    from dask_otel_spans.scheduler.graphs import SpanAnnotation
    from dask_otel_spans.scheduler.heartbeats import SpanDeltas
    from dask_otel_spans.scheduler.sampler import TransitionKwargs

#: Spans, keys or task groups handled between two pauses (~1 µs each)
SPANS_PER_STEP = 256
#: Spans whose code snippets forwarded are counted at most (``include-code``): the
#: oldest is forgotten past it (snippets sent again change nothing there)
MAX_CODE_COUNTED = 1000


class Sink(Protocol):
    """Where the forwarder sends messages: the transport
    (:class:`~dask_otel_spans.transport.choice.Transport`)."""

    def send(self, messages: list[Message]) -> None:
        """Queue ``messages`` in order; never blocks."""


class QueuedGraph(NamedTuple):
    """A graph the ``update_graph`` hook queued, read at the next tick: its keys and
    the annotations the scheduler passed (``otel``, ``span``, ``otel-caller``), and
    the default span's id when it came (for bare submissions)."""

    time: float
    client: str | None
    keys: Collection[Key]
    otel: Mapping[Key, object] | None
    span_of_key: Mapping[Key, SpanAnnotation] | None
    callers: Mapping[Key, object] | None
    default_id: str | None


@dataclass
class Changes:
    """What the hooks noted since the last tick; a tick takes it whole, so what
    comes while it runs waits for the next one."""

    #: hook events in the order they came: queued graphs, and close notices and
    #: departed clients as the messages they become
    pending: deque[QueuedGraph | Message] = field(default_factory=deque)
    #: task groups whose tasks started or settled
    touched: set[TaskGroup] = field(default_factory=set)
    #: task group -> tasks of it that erred
    erred: dict[TaskGroup, int] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.pending or self.touched or self.erred)


@dataclass
class Forwarded:
    """What the export side was told so far."""

    #: spans of the extension's dict (in insertion order) forwarded so far
    n_known: int
    #: spans of the dict when the forwarder started: those done then were never
    #: forwarded (a new export process is not sent them either)
    first: int = 0
    #: the number of workers last forwarded (-1: none yet)
    workers: int = -1
    #: task groups forwarded as running and not as done since (as many as the groups
    #: running now), not told again while they run: their tasks by state as sent
    running: dict[TaskGroup, Counts] = field(default_factory=dict)
    #: span id -> code snippets forwarded (``include-code``), of the spans whose
    #: graphs came lately (:data:`MAX_CODE_COUNTED`)
    code: dict[str, int] = field(default_factory=dict)
    #: spans forwarded (adopted ones too)
    spans: int = 0
    #: ``spans`` when the last adoption started: the spans forwarded to the export
    #: process running now are those counted since
    spans_before_adoption: int = 0

    def for_a_new_copy(self) -> None:
        """The export side starts a new copy (at start, or a new export process):
        it knows no worker count, no running group, no code."""
        self.workers = -1
        self.running.clear()
        self.code.clear()
        self.spans_before_adoption = self.spans


class SpanForwarder:
    """Forward the scheduler's span events to the transport.

    The plugin's hooks tell it what happened (:meth:`graph_submitted`,
    :meth:`close_notice`, :meth:`client_gone`, :meth:`task_moved`), each O(1); the
    plugin's tick runs :meth:`tick_steps`, which forwards what came since, and
    :meth:`adopt` at start and for a new export process.

    Parameters
    ----------
    spans:
        The ``SpansSchedulerExtension``'s span dict (insertion-ordered, never
        forgets a span)
    tasks:
        The scheduler's task dict
    sink:
        The transport: its ``send(messages)`` queues messages, never blocking
    include_code:
        Forward the source code snippets the client sent for each span
    sampler:
        Keeps the tasks that get task spans (:meth:`task_moved` feeds it); default:
        none
    by_name:
        The extension's spans by name (``spans_search_by_name``): where the default
        span is
    clock:
        The time of the hooks' events and of the counts' sweeps (default:
        distributed's ``time``)
    live_interval:
        ``live.interval``: every running group's tasks by state are read again this
        often, every ``COUNTS_INTERVAL`` (1 s) at most
    """

    def __init__(
        self,
        spans: dict[str, Span],
        tasks: Mapping[Key, TaskState],
        sink: Sink,
        include_code: bool = False,
        sampler: TaskSampler | None = None,
        by_name: Mapping[tuple[str, ...], list[Span]] | None = None,
        clock: Callable[[], float] = time,
        live_interval: float = COUNTS_INTERVAL,
    ):
        self.spans = spans
        self.clock = clock
        self.by_name = by_name if by_name is not None else {}
        self.tasks = tasks
        self.sink = sink
        self.include_code = include_code
        self.sampler = sampler if sampler is not None else TaskSampler(NONE, 0)
        self.changes = Changes()
        #: a tick is forwarding hook events (heartbeat deltas wait behind them)
        self._events_in_flight = False
        self.forwarded = Forwarded(n_known=len(spans), first=len(spans))
        self.sweep = CountsSweep(min(COUNTS_INTERVAL, live_interval), clock)

    # -- what the hooks tell it (O(1) each) ----------------------------------------------

    def graph_submitted(self, client: str | None, keys: Collection[Key],
                        annotations: Mapping[str, Mapping[Key, Any]] | None) -> None:
        """A graph reached the scheduler (``update_graph``): queued as it is."""
        otel = span_of_key = callers = default_id = None
        if annotations:
            otel = annotations.get(names.ANNOTATION_KEY)
            span_of_key = annotations.get("span")
            callers = annotations.get(names.CALLER_ANNOTATION_KEY)
            if callers:
                # (where dask put tasks of no span block: their group tells only
                # while they are not forgotten, which may be by the tick)
                default_id = self.default_span_id()
        self.changes.pending.append(QueuedGraph(self.clock(), client, keys, otel, span_of_key,
                                                callers, default_id))

    def close_notice(self, msg: object) -> None:
        """The client helper's block exited (``log_event`` on its topic)."""
        self.changes.pending.append(events.close_notice(self.clock(), msg))

    def client_gone(self, client: str) -> None:
        """A client left the scheduler."""
        self.changes.pending.append(events.client_gone(self.clock(), client))

    def task_moved(self, key: Key, start: str, finish: str,
                   kwargs: TransitionKwargs) -> None:
        """Task ``key`` started or settled (the ``transition`` hook, which skips the
        others): its group is noted for the next tick; a task that erred is counted
        and, like one that finished under ``task-spans: slowest`` or ``all``, goes
        to the task sampler (from the worker's report in ``kwargs``)."""
        ts = self.tasks.get(key)
        if ts is None:
            return
        tg = ts.group
        self.changes.touched.add(tg)
        if finish == "erred":
            erred = self.changes.erred
            erred[tg] = erred.get(tg, 0) + 1
            if start == "processing":  # (it ran: not erred by a dependency)
                self.sampler.erred(tg, key, kwargs, ts.run_spec)
        elif (self.sampler.finished is not None and finish == "memory"
              and start == "processing"):
            self.sampler.finished(tg, key, kwargs, ts.run_spec)

    def default_span_id(self) -> str | None:
        """The id of dask's current default span (O(1)); None when there is none."""
        defaults = self.by_name.get((names.DEFAULT_SPAN_TAG,))
        return defaults[-1].id if defaults else None

    def take_over(self, previous: SpanForwarder) -> None:
        """Go on from where ``previous`` (the instance registered before, whose
        transport this one keeps) was: nothing is forwarded twice or left out."""
        self.changes, previous.changes = previous.changes, Changes()
        self.forwarded = previous.forwarded
        self.sampler.take_over(previous.sampler)

    @property
    def forwarded_to_this_copy(self) -> int:
        """Spans forwarded to the export side's current copy (since the last
        adoption)."""
        return self.forwarded.spans - self.forwarded.spans_before_adoption

    # -- forwarding --------------------------------------------------------------------

    def forward_deltas(self, deltas: SpanDeltas) -> None:
        """A heartbeat's span metric deltas, after the spans created since the last
        call (O(new)): the export side knows every span they name. While hook events
        wait for a tick (or a tick forwards them), the deltas go behind them: a
        graph's contexts reach the export side before the metrics of its tasks, whose
        exemplars link to the trace the graph carried (O(1))."""
        if self.changes.pending or self._events_in_flight:
            self.changes.pending.append(events.span_deltas(deltas))
            return
        out: list[Message] = []
        self._new_spans(out)
        out.append(events.span_deltas(deltas))
        self.sink.send(out)

    def _new_spans(self, out: list[Message]) -> None:
        spans = self.spans
        n = len(spans)
        start = self.forwarded.n_known
        if n <= start:
            return
        fresh = list(islice(reversed(spans.values()), 0, n - start))
        self.forwarded.n_known = n
        out.extend(map(span_message, reversed(fresh), range(start, n)))
        self.forwarded.spans += len(fresh)

    def _send(self, out: list[Message], counts: list[Entry] | None = None) -> None:
        """Send ``out`` (then the ``counts`` message of ``counts``), the spans created
        meanwhile first: what the messages name is known where they arrive."""
        if counts:
            out.append(events.group_counts(counts))
        spans: list[Message] = []
        self._new_spans(spans)
        if spans or out:
            self.sink.send(spans + out)

    def idle(self, n_workers: int) -> bool:
        """Whether a tick would forward nothing: no span, hook event, task group or
        worker count came since the last one, and no sweep of the running groups'
        counts is due (O(1))."""
        return (n_workers == self.forwarded.workers
                and len(self.spans) <= self.forwarded.n_known and not self.changes
                and not self.sweep.due(self.forwarded.running))

    def tick(self, n_workers: int) -> None:
        """Forward what came since the last tick, in one go (:meth:`tick_steps`)."""
        for _ in self.tick_steps(n_workers):
            pass

    def tick_steps(self, n_workers: int) -> Iterator[None]:
        """Forward what came since the last tick: the worker count, the new spans,
        the hooks' events in the order they came, then the task groups touched, then
        the running groups' counts when a sweep is due. Pauses (yields) every
        ``SPANS_PER_STEP`` spans, keys or groups, each time after sending what it
        has."""
        changes, self.changes = self.changes, Changes()
        self._forward_workers(n_workers)
        yield from self._forward_new_spans()
        self._events_in_flight = True
        try:
            yield from self._forward_hook_events(changes.pending)
        finally:
            self._events_in_flight = False
        # (after the graphs: the groups of their tasks are known there by then)
        yield from self._forward_groups(changes.touched, changes.erred)
        if self.sweep.due(self.forwarded.running):
            yield from self._sweep_counts()

    def _forward_workers(self, n_workers: int) -> None:
        if n_workers != self.forwarded.workers:
            self.forwarded.workers = n_workers
            self.sink.send([events.worker_count(n_workers)])

    def _forward_new_spans(self) -> Iterator[None]:
        """The new spans, read from the dict's end once (O(new)), in steps; spans
        created meanwhile go with the next messages (:meth:`_send`) or the next
        tick."""
        spans, forwarded = self.spans, self.forwarded
        start, n = forwarded.n_known, len(spans)
        fresh = list(islice(reversed(spans.values()), 0, max(0, n - start)))
        fresh.reverse()
        at = start
        while at < n:
            # (a heartbeat may have forwarded some of them meanwhile)
            at = max(at, forwarded.n_known)
            if at >= n:
                break
            upto = min(n, at + SPANS_PER_STEP)
            forwarded.n_known = max(forwarded.n_known, upto)
            self.sink.send(list(map(
                span_message, fresh[at - start:upto - start], range(at, upto)
            )))
            forwarded.spans += upto - at
            at = upto
            yield

    def _forward_hook_events(self, pending: deque[QueuedGraph | Message]
                             ) -> Iterator[None]:
        """The hooks' events in the order they came: a queued graph becomes its
        ``graph`` message (read in steps), the others are messages already."""
        out: list[Message] = []
        for event in pending:
            if not isinstance(event, QueuedGraph):
                out.append(event)
                continue
            if out and large(event.keys):
                self._send(out)  # (what came before it, first)
                out = []
            yield from self._graph_message(event, out)
        self._send(out)

    def _graph_message(self, graph: QueuedGraph, out: list[Message]) -> Iterator[None]:
        """Append the ``graph`` message of a queued graph to ``out`` (and its spans'
        code, with ``include-code``), reading its keys in steps."""
        span_ids: set[str] = set()
        collisions: set[tuple[str, str, str]] = set()
        yield from collect_span_ids(graph.keys, graph.span_of_key, self.tasks, span_ids,
                                    otel=graph.otel, collisions=collisions)
        links: dict[tuple[str, str], dict[str, str]] = {}
        if graph.callers:
            yield from collect_links(graph.keys, graph.callers, graph.otel,
                                     graph.span_of_key, self.tasks, links,
                                     graph.default_id)
        ids = [s for s in span_ids if type(s) is str]
        if self.include_code:
            self.code_messages(ids, out)
        out.append(events.graph_submitted(
            graph.time, graph.client, ids, distinct_chains(graph.otel), sorted(collisions),
            [(span_id, headers) for (span_id, _), headers in links.items()]))

    def _forward_groups(self, touched: set[TaskGroup], erred: dict[TaskGroup, int]
                        ) -> Iterator[None]:
        """The groups' errors, then each touched group when it is done, or when it
        runs and was not running there, then the counts of the running ones that
        changed."""
        take_classes = self.sampler.take_erred_classes
        out = [events.group_erred(tg.span_id, id(tg), n, classes)
               for tg, n in erred.items()
               # (taken for every group: none is left behind)
               for classes in (take_classes(tg),) if tg.span_id is not None]
        counts: list[Entry] = []
        for i, tg in enumerate(touched, 1):
            if i % SPANS_PER_STEP == 0:
                self._send(out, counts)
                out, counts = [], []
                yield
            self._group_message(tg, out, counts)
        self._send(out, counts)

    def _sweep_counts(self) -> Iterator[None]:
        """Every running group's counts, those that changed (scheduler/counts.py)."""
        for entries in self.sweep.entries(self.forwarded.running, SPANS_PER_STEP):
            if entries:
                self.sink.send([events.group_counts(entries)])
            yield

    def _group_message(self, tg: TaskGroup, out: list[Message], counts: list[Entry]) -> None:
        running = self.forwarded.running
        span_id = tg.span_id
        if span_id is None:
            if group_done(tg):
                self.sampler.take_erred_window(tg)  # (no span to tell)
        elif group_done(tg):
            running.pop(tg, None)
            out.append(events.group_done(
                span_id, id(tg), done_figures(tg, self.sampler.take_erred_window(tg))))
            self._tasks_of(tg, span_id, out)
        elif tg not in running:  # (its counts: now, then at each sweep)
            out.append(events.group_running(span_id, id(tg), str(tg.prefix.name)))
            note_counts(running, tg, counts)

    def _tasks_of(self, tg: TaskGroup, span_id: str, out: list[Message]) -> None:
        """The ``tasks`` message of a group, when the sampler kept some."""
        tasks = self.sampler.take(tg)
        if tasks is not None:
            out.append(events.group_tasks(span_id, id(tg), str(tg.prefix.name),
                                          *tasks.message_fields()))

    def forward_tasks_left(self) -> None:
        """Forward the tasks kept of groups not done (the scheduler is closing)."""
        out: list[Message] = []
        for tg in list(self.sampler.groups):
            if tg.span_id is not None:
                self._tasks_of(tg, tg.span_id, out)
        self.sampler.forget()
        self._send(out)

    def code_messages(self, span_ids: list[str], out: list[Message]) -> None:
        """Append to ``out`` the code snippets of these spans not forwarded yet
        (``include-code``; adoption too)."""
        code_forwarded = self.forwarded.code
        for span_id in span_ids:
            span = self.spans.get(span_id)
            code = code_snippets(span) if span is not None else None
            if not code:
                continue
            sent = code_forwarded.pop(span_id, 0)
            code_forwarded[span_id] = len(code)  # (the latest last)
            if len(code) > sent:
                out.append(events.span_code(span_id, tuple(islice(code, sent, None))))
            while len(code_forwarded) > MAX_CODE_COUNTED:
                del code_forwarded[next(iter(code_forwarded))]

    def adopt(self, handed_over: Container[int] | None = None) -> Iterator[None]:
        """Forward the spans that exist already and still run, at start and for a
        new export process (:func:`~dask_otel_spans.scheduler.adoption.adopt_spans`).
        Pauses (yields) every ``SPANS_PER_STEP`` spans."""
        return adopt_spans(self, handed_over, SPANS_PER_STEP)

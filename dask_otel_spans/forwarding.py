"""The scheduler's side of tracking spans in the export process: forward what happens
to dask spans (new spans, graphs, close notices, departed clients, task groups that
start or settle) as plain messages, with no state of the spans kept here.

The export process rebuilds the span tree from these messages
(:mod:`~dask_otel_spans.mirror`) and decides there when a span is ready; the scheduler's
event loop only reads what changed since the last tick and queues it for the sender
thread of :class:`~dask_otel_spans.export_process.ExportProcess`.

Messages (tuples of built-ins, in the order they are to be applied):

- ``("span", ids, name, enqueued, nthreads_offset, position)``: a new dask span;
  ``ids`` is its chain of span ids, root first (its own last); ``position`` its
  place in the extension's span dict (the export process reports the highest it
  has, :meth:`SpanForwarder.adopt` starts again after it);
- ``("run", span_id, group_name, prefix)``: a task group of the span has a task in a
  running state (new tasks, or tasks to compute again): once when it starts to run
  (again), not at every task that starts or settles while it runs;
- ``("done", span_id, group_name, figures)``: every task of the group settled;
  ``figures`` as :func:`~dask_otel_spans.snapshot.snapshot_group`;
- ``("metrics", span_id, metrics)``: the span's cumulative metrics so far (adopted
  spans only: later ones come as heartbeat deltas);
- ``("workers", n)``: the number of workers changed (the grace period follows it);
- events, each its own item so that one that cannot cross is left out alone:
  ``("graph", time, client, span_ids, chains)``, ``("notice", time, msg)``,
  ``("client-gone", time, client)``.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping
from itertools import islice
from typing import TYPE_CHECKING, Any

from distributed.scheduler import ALL_TASK_STATES

from dask_otel_spans.snapshot import snapshot_group

if TYPE_CHECKING:
    from distributed.spans import Span

#: Kinds of queued hook events (as the plugin queues them)
GRAPH, NOTICE, CLIENT_GONE = "graph", "notice", "client-gone"
#: Spans looked at between two pauses of an adoption (~1 µs each)
SPANS_PER_STEP = 256
#: Task states a transition can leave a TaskGroup done in (``TaskGroup.done``)
SETTLED_STATES = frozenset({"memory", "erred", "released", "forgotten"})
#: The others: a TaskGroup with a task in one of them is not done
RUNNING_STATES = tuple(sorted(ALL_TASK_STATES - SETTLED_STATES))


def group_done(tg: Any, running_states: tuple[str, ...] = RUNNING_STATES) -> bool:
    """``TaskGroup.done`` (no task in a running state) from its state counts,
    without its generator over every state: a few µs a span, on the event loop."""
    states = tg.states
    for state in running_states:
        if states.get(state):
            return False
    return True


def chain_ids(span: Span) -> tuple[str, ...]:
    """The ids of ``span`` and its ancestors, root first."""
    ids = []
    node: Span | None = span
    while node is not None:
        ids.append(node.id)
        node = node.parent
    return tuple(reversed(ids))


def collect_span_ids(keys: Any, span_of_key: Any, tasks: Mapping[Any, Any],
                     span_ids: set[str], step: int = SPANS_PER_STEP
                     ) -> Iterator[None]:
    """Add to ``span_ids`` the ids of the spans a graph's tasks are in: from the
    ``span`` annotation the scheduler passed (it outlives the task, which may be
    forgotten by now), else from the task's group. Pauses (yields) every ``step``
    keys."""
    if not isinstance(span_of_key, Mapping):
        span_of_key = {}
    last_group = None
    for i, key in enumerate(keys, 1):
        if i % step == 0:
            yield
        ann = span_of_key.get(key)
        if ann:
            try:
                span_ids.add(ann["ids"][-1])
                continue
            except (KeyError, IndexError, TypeError):
                pass  # not distributed's shape: the task's group says
        ts = tasks.get(key)
        if ts is None:
            continue
        tg = ts.group
        if tg is not last_group:
            last_group = tg
            if tg.span_id is not None:
                span_ids.add(tg.span_id)


def span_message(span: Span, position: int) -> tuple[Any, ...]:
    return (
        "span", chain_ids(span), tuple(span.name), span.enqueued,
        getattr(span, "_total_nthreads_offset", 0), position,
    )


class SpanForwarder:
    """Forward the scheduler's span events to the export process.

    Parameters
    ----------
    spans:
        The ``SpansSchedulerExtension``'s span dict (insertion-ordered, never
        forgets a span)
    tasks:
        The scheduler's task dict
    sink:
        Where messages go: its ``forward(items)`` queues structural messages, its
        ``forward_events(items)`` events (the export process's sender)
    running_states:
        Task states in which a task group is not done
    """

    def __init__(
        self,
        spans: Mapping[str, Span],
        tasks: Mapping[Any, Any],
        sink: Any,
        running_states: tuple[str, ...],
    ):
        self.spans = spans
        self.tasks = tasks
        self.sink = sink
        self.running_states = running_states
        #: spans of ``spans`` (in insertion order) forwarded so far
        self.n_known = len(spans)
        #: task groups whose tasks started or settled since the last tick (the
        #: plugin's ``transition`` hook adds them)
        self.touched: set[Any] = set()
        #: task groups forwarded as running and not as done since: the export
        #: process has them running, and is not told again while they run (as
        #: many as the groups running now)
        self.running_forwarded: set[Any] = set()
        self.workers = -1
        #: figures for tests and benchmarks: spans forwarded (adopted ones too)
        self.forwarded_spans = 0
        #: ``forwarded_spans`` when the last adoption started: the spans forwarded
        #: to the export process running now are those counted since
        self.forwarded_before_adoption = 0
        self.forwarded_groups = 0

    def forward_new_spans(self) -> None:
        """Forward the spans created since the last call (O(new)); before metric
        deltas, so that the export process knows every span they name."""
        out: list[tuple[Any, ...]] = []
        self._new_spans(out)
        if out:
            self.sink.forward(out)

    def _new_spans(self, out: list[tuple[Any, ...]]) -> None:
        spans = self.spans
        n = len(spans)
        start = self.n_known
        if n <= start:
            return
        fresh = list(islice(reversed(spans.values()), 0, n - start))
        self.n_known = n
        out.extend(map(span_message, reversed(fresh), range(start, n)))
        self.forwarded_spans += len(fresh)

    def _send(self, out: list[tuple[Any, ...]],
              events: list[tuple[Any, ...]] | None = None) -> None:
        """Queue ``out`` (and ``events``, after it), the spans created meanwhile
        first: what the messages name is known where they arrive."""
        spans: list[tuple[Any, ...]] = []
        self._new_spans(spans)
        if spans or out:
            self.sink.forward(spans + out)
        if events:
            self.sink.forward_events(events)

    def tick(self, pending: deque[tuple[Any, ...]], n_workers: int) -> None:
        """Forward what came since the last tick, in one go (:meth:`tick_steps`)."""
        for _ in self.tick_steps(pending, n_workers):
            pass

    def tick_steps(self, pending: deque[tuple[Any, ...]], n_workers: int
                   ) -> Iterator[None]:
        """Forward what came since the last tick: the new spans, the queued hook
        events in the order they came, then the task groups touched. Pauses
        (yields) every ``SPANS_PER_STEP`` spans, keys or groups, each time after
        queueing what it has (the spans created meanwhile before it)."""
        if n_workers != self.workers:
            self.workers = n_workers
            self.sink.forward([("workers", n_workers)])
        # the new spans, read from the dict's end once (O(new)), in steps; spans
        # created meanwhile go with the next messages (_send) or the next tick
        spans = self.spans
        start, n = self.n_known, len(spans)
        fresh = list(islice(reversed(spans.values()), 0, max(0, n - start)))
        fresh.reverse()
        at = start
        while at < n:
            # (a heartbeat may have forwarded some of them meanwhile)
            at = max(at, self.n_known)
            if at >= n:
                break
            upto = min(n, at + SPANS_PER_STEP)
            self.n_known = max(self.n_known, upto)
            self.sink.forward(list(map(
                span_message, fresh[at - start:upto - start], range(at, upto)
            )))
            self.forwarded_spans += upto - at
            at = upto
            yield
        events: list[tuple[Any, ...]] = []
        for _ in range(len(pending)):  # (those that come meanwhile: the next tick)
            event = pending.popleft()
            kind = event[0]
            if kind == GRAPH:
                _, _, now, client, keys, otel, span_of_key = event
                span_ids: set[str] = set()
                if events and _large(keys):
                    self._send([], events)  # (what came before it, first)
                    events = []
                yield from collect_span_ids(keys, span_of_key, self.tasks, span_ids)
                events.append(("graph", now, client,
                               [s for s in span_ids if type(s) is str],
                               _chains(otel)))
            elif kind == NOTICE:
                events.append(("notice", event[2], event[3]))
            elif kind == CLIENT_GONE:
                events.append(("client-gone", event[2], event[3]))
        self._send([], events)
        # (after the graphs: their new tasks' groups are touched by then); a group
        # goes when it is done, or when it runs and was not running there
        touched, self.touched = self.touched, set()
        running, running_forwarded = self.running_states, self.running_forwarded
        out = []
        for i, tg in enumerate(touched, 1):
            if i % SPANS_PER_STEP == 0:
                self._send(out)
                out = []
                yield
            span_id = tg.span_id
            if span_id is None:
                continue
            if group_done(tg, running):
                running_forwarded.discard(tg)
                out.append(("done", span_id, tg.name, snapshot_group(tg)))
            elif tg not in running_forwarded:
                running_forwarded.add(tg)
                out.append(("run", span_id, tg.name, str(tg.prefix.name)))
            else:
                continue
            self.forwarded_groups += 1
        self._send(out)

    def adopt(self, resend_from: int | None = None) -> Iterator[None]:
        """Forward the spans that exist already and still run (a task group not
        done), with their ancestors, task groups and metrics so far: at start, and
        for a new export process. Pauses (yields) every ``SPANS_PER_STEP`` spans;
        spans created meanwhile are forwarded by the ticks.

        ``resend_from``: for a new export process, the first position the one that
        died did not say it had; the spans from there on are forwarded again done
        or not (what was written to a dying process's pipe is lost with it). None
        of them can have been emitted there: a span is emitted a grace period after
        its last task, and the process reports what it has every half second.
        """
        upto = self.n_known
        self.workers = -1  # (the next tick tells the new copy the number)
        self.running_forwarded.clear()  # (a new copy has none of them running)
        self.forwarded_before_adoption = self.forwarded_spans
        running = self.running_states
        positions: dict[str, int] = {}  # span id -> position, of the spans sent
        out: list[tuple[Any, ...]] = []
        for i, span in enumerate(islice(list(self.spans.values()), upto)):
            if i and i % SPANS_PER_STEP == 0:
                if out:
                    self.sink.forward(out)
                    out = []
                yield
            if span.id in positions:
                continue
            if all(group_done(tg, running) for tg in list(span.groups)):
                if resend_from is not None and i >= resend_from:
                    # (alone: its done ancestors were in the dead process's hands)
                    positions[span.id] = i
                    self._adopted(span, i, out)
                continue
            chain = []
            node: Span | None = span
            while node is not None and node.id not in positions:
                chain.append(node)
                node = node.parent
            for node in reversed(chain):
                # (an ancestor's place is not known here: -1 does not count)
                positions[node.id] = i if node is span else -1
                self._adopted(node, positions[node.id], out)
        if out:
            self.sink.forward(out)

    def _adopted(self, span: Span, position: int, out: list[tuple[Any, ...]]) -> None:
        """The messages of an adopted span: itself, its groups, its metrics."""
        running = self.running_states
        out.append(span_message(span, position))
        self.forwarded_spans += 1
        for tg in list(span.groups):
            message = _group_message(tg, span.id, running)
            if message[0] == "run":  # (the ticks need not send it again)
                self.running_forwarded.add(tg)
            out.append(message)
        metrics = getattr(span, "_cumulative_worker_metrics", None)
        if metrics:
            out.append(("metrics", span.id, dict(metrics)))


def _large(keys: Any) -> bool:
    """Whether a graph's keys take more than one step."""
    try:
        return len(keys) > SPANS_PER_STEP
    except TypeError:
        return True


def _group_message(tg: Any, span_id: str, running: tuple[str, ...]) -> tuple[Any, ...]:
    if group_done(tg, running):
        return ("done", span_id, tg.name, snapshot_group(tg))
    return ("run", span_id, tg.name, str(tg.prefix.name))


def _chains(otel: Any) -> list[Any]:
    """The distinct chains of an ``otel`` annotation (one value object per chain of
    spans; a graph of many tasks of one chain carries it once): the annotation as
    it came when it is not a mapping (the export process says it is malformed)."""
    if not isinstance(otel, Mapping):
        return otel
    seen: dict[int, Any] = {}
    for value in otel.values():
        seen.setdefault(id(value), value)
    return list(seen.values())

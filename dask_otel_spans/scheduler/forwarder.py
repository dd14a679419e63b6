"""The forwarder: the only plugin code on the scheduler's event loop besides the
hooks. It reads what changed since the last tick (new spans, the hooks' queued events,
task groups that started or settled, heartbeat deltas) and sends it as messages of
the protocol (:mod:`~dask_otel_spans.protocol.events`) to the transport, keeping no state of
the spans: work proportional to what changed, in steps that the plugin runs in
slices of the plugin's tick budget.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping
from itertools import islice
from typing import TYPE_CHECKING, Any

from distributed.utils import key_split_group

from dask_otel_spans import names
from dask_otel_spans.protocol import events
from dask_otel_spans.protocol.dask_facts import group_done
from dask_otel_spans.protocol.propagation import w3c_headers
from dask_otel_spans.protocol.snapshots import done_figures
from dask_otel_spans.protocol.tasks import NONE
from dask_otel_spans.scheduler.sampler import TaskSampler

if TYPE_CHECKING:
    from distributed.spans import Span

#: Kinds of the hooks' queued events
GRAPH, NOTICE, CLIENT_GONE = events.GRAPH, events.NOTICE, events.CLIENT_GONE
#: Spans, keys or task groups handled between two pauses (~1 µs each)
SPANS_PER_STEP = 256


def chain_ids(span: Span) -> tuple[str, ...]:
    """The ids of ``span`` and its ancestors, root first."""
    ids = []
    node: Span | None = span
    while node is not None:
        ids.append(node.id)
        node = node.parent
    return tuple(reversed(ids))


def collect_span_ids(keys: Any, span_of_key: Any, tasks: Mapping[Any, Any],
                     span_ids: set[str], step: int = SPANS_PER_STEP, *,
                     otel: Any = None,
                     collisions: set[tuple[str, str, str]] | None = None,
                     ) -> Iterator[None]:
    """Add to ``span_ids`` the ids of the spans a graph's tasks are in: from the
    ``span`` annotation the scheduler passed (it outlives the task, which may be
    forgotten by now), else from the task's group. Pauses (yields) every ``step``
    keys.

    With the ``otel`` annotation of the client helper and a ``collisions`` set, adds
    to it ``(asked span id, span id dask chose, task group)`` where dask put tasks
    in a span that is neither the one their block asked for nor inside it (their
    TaskGroup belonged to an earlier span): checked when the chain or the span
    changes from one key to the next (all tasks of one block share them).
    """
    if not isinstance(span_of_key, Mapping):
        span_of_key = {}
    if not isinstance(otel, Mapping) or collisions is None:
        otel = None
    last_group = last_chain = last_span = None
    for i, key in enumerate(keys, 1):
        if i % step == 0:
            yield
        ann = span_of_key.get(key)
        if ann:
            try:
                span_id = ann["ids"][-1]
            except (KeyError, IndexError, TypeError):
                pass  # not distributed's shape: the task's group says
            else:
                span_ids.add(span_id)
                if otel is not None:
                    # (dask builds each key's annotation anew, but the span id in
                    # it is the span's own string, and the chain is shared)
                    chain = otel.get(key)
                    if chain is not last_chain or span_id is not last_span:
                        last_chain, last_span = chain, span_id
                        _note_collision(key, ann, chain, tasks, collisions)
                continue
        ts = tasks.get(key)
        if ts is None:
            continue
        tg = ts.group
        if tg is not last_group:
            last_group = tg
            if tg.span_id is not None:
                span_ids.add(tg.span_id)


def collect_links(keys: Any, callers: Any, otel: Any, span_of_key: Any,
                  tasks: Mapping[Any, Any],
                  links: dict[tuple[str, str], dict[str, str]],
                  default_id: str | None = None,
                  step: int = SPANS_PER_STEP) -> Iterator[None]:
    """Add to ``links`` the distinct ``(span id, caller traceparent) -> W3C headers``
    of a graph's bare submissions: tasks with an ``otel-caller`` annotation
    (``callers``: key -> carrier) and no ``span()`` chain (``otel``), in the span dask
    put them in (the ``span`` annotation's, else their group's, else, for a task
    forgotten by now, ``default_id``: the default span when the graph came). Pauses
    (yields) every ``step`` keys; a graph's tasks share one carrier, read once."""
    if not isinstance(callers, Mapping):
        return
    if not isinstance(span_of_key, Mapping):
        span_of_key = {}
    if not isinstance(otel, Mapping):
        otel = {}
    last_caller = last_span = None
    for i, key in enumerate(keys, 1):
        if i % step == 0:
            yield
        caller = callers.get(key)
        if caller is None or key in otel:
            continue
        ann = span_of_key.get(key)
        span_id = None
        if ann:
            try:
                span_id = ann["ids"][-1]
            except (KeyError, IndexError, TypeError):
                pass
        if span_id is None:
            ts = tasks.get(key)
            span_id = ts.group.span_id if ts is not None else default_id
        if type(span_id) is not str or (caller is last_caller
                                        and span_id is last_span):
            continue
        last_caller, last_span = caller, span_id
        headers = w3c_headers(caller)
        if headers is not None:
            links.setdefault((span_id, headers["traceparent"]), headers)


def _note_collision(key: Any, ann: Any, chain: Any, tasks: Mapping[Any, Any],
                    collisions: set[tuple[str, str, str]]) -> None:
    """Add the collision of ``key``'s tasks to ``collisions``, if there is one (a
    malformed chain says nothing: the export session says it is malformed)."""
    if not isinstance(chain, Mapping) or not chain:
        return
    try:
        asked = next(reversed(chain.keys()))
        ids = tuple(ann["ids"])
    except Exception:
        return
    if asked in ids:
        return  # the asked span, or a plain distributed.span inside it
    ts = tasks.get(key)
    # (a task released by now: its group is named after its key, as dask does)
    group = str(ts.group.name) if ts is not None else key_split_group(key)
    collisions.add((str(asked), str(ids[-1]), group))


def span_message(span: Span, position: int) -> tuple[Any, ...]:
    """The ``span`` message of a span at ``position`` in the extension's dict."""
    return (
        events.SPAN, chain_ids(span), tuple(span.name), span.enqueued,
        getattr(span, "_total_nthreads_offset", 0), position,
    )


class SpanForwarder:
    """Forward the scheduler's span events to the transport.

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
        Keeps the tasks that get task spans (the plugin's ``transition`` hook feeds
        it); default: none
    by_name:
        The extension's spans by name (``spans_search_by_name``): where the default
        span is
    """

    def __init__(
        self,
        spans: Mapping[str, Span],
        tasks: Mapping[Any, Any],
        sink: Any,
        include_code: bool = False,
        sampler: TaskSampler | None = None,
        by_name: Mapping[tuple[str, ...], list[Span]] | None = None,
    ):
        self.spans = spans
        self.by_name = by_name if by_name is not None else {}
        self.tasks = tasks
        self.sink = sink
        self.include_code = include_code
        self.sampler = sampler if sampler is not None else TaskSampler(NONE, 0)
        #: the hooks' events not forwarded yet: ``(GRAPH, time, client, keys, otel,
        #: span_of_key, callers, default span id)``, ``(NOTICE, time, msg)``, ``(CLIENT_GONE, time, client)``
        self.pending: deque[tuple[Any, ...]] = deque()
        #: spans of ``spans`` (in insertion order) forwarded so far
        self.n_known = len(spans)
        #: task groups whose tasks started or settled since the last tick (the
        #: plugin's ``transition`` hook adds them)
        self.touched: set[Any] = set()
        #: task group -> tasks of it that erred since the last tick (the plugin's
        #: ``transition`` hook counts them)
        self.erred: dict[Any, int] = {}
        #: task groups forwarded as running and not as done since (as many as the
        #: groups running now): not told again while they run
        self.running_forwarded: set[Any] = set()
        #: span id -> code snippets forwarded (``include-code``)
        self.code_sent: dict[str, int] = {}
        self.workers = -1
        #: spans forwarded (adopted ones too)
        self.forwarded_spans = 0
        #: ``forwarded_spans`` when the last adoption started: the spans forwarded
        #: to the export process running now are those counted since
        self.forwarded_before_adoption = 0
        self.forwarded_groups = 0

    def default_span_id(self) -> str | None:
        """The id of dask's current default span (O(1)); None when there is none."""
        defaults = self.by_name.get((names.DEFAULT_SPAN_TAG,))
        return defaults[-1].id if defaults else None

    def take_over(self, previous: SpanForwarder) -> None:
        """Go on from where ``previous`` (the instance registered before, whose
        transport this one keeps) was: nothing is forwarded twice or left out."""
        self.pending.extend(previous.pending)
        previous.pending.clear()
        self.sampler.groups.update(previous.sampler.groups)
        self.sampler.erred_windows.update(previous.sampler.erred_windows)
        self.sampler.erred_classes.update(previous.sampler.erred_classes)
        for name in ("n_known", "touched", "erred", "running_forwarded", "code_sent",
                     "workers", "forwarded_spans", "forwarded_before_adoption",
                     "forwarded_groups"):
            setattr(self, name, getattr(previous, name))

    def forward_deltas(self, deltas: Mapping[Any, float]) -> None:
        """A heartbeat's span metric deltas, after the spans created since the last
        call (O(new)): the export side knows every span they name."""
        out: list[tuple[Any, ...]] = []
        self._new_spans(out)
        out.append((events.DELTAS, deltas))
        self.sink.send(out)

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

    def _send(self, out: list[tuple[Any, ...]]) -> None:
        """Send ``out``, the spans created meanwhile first: what the messages name
        is known where they arrive."""
        spans: list[tuple[Any, ...]] = []
        self._new_spans(spans)
        if spans or out:
            self.sink.send(spans + out)

    def idle(self, n_workers: int) -> bool:
        """Whether a tick would forward nothing: no span, hook event, task group or
        worker count came since the last one (O(1))."""
        return (n_workers == self.workers and len(self.spans) <= self.n_known
                and not self.pending and not self.touched and not self.erred)

    def tick(self, n_workers: int) -> None:
        """Forward what came since the last tick, in one go (:meth:`tick_steps`)."""
        for _ in self.tick_steps(n_workers):
            pass

    def tick_steps(self, n_workers: int) -> Iterator[None]:
        """Forward what came since the last tick: the new spans, the queued hook
        events in the order they came, then the task groups touched. Pauses
        (yields) every ``SPANS_PER_STEP`` spans, keys or groups, each time after
        sending what it has."""
        if n_workers != self.workers:
            self.workers = n_workers
            self.sink.send([(events.WORKERS, n_workers)])
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
            self.sink.send(list(map(
                span_message, fresh[at - start:upto - start], range(at, upto)
            )))
            self.forwarded_spans += upto - at
            at = upto
            yield
        out = []
        pending = self.pending
        for _ in range(len(pending)):  # (those that come meanwhile: the next tick)
            event = pending.popleft()
            kind = event[0]
            if kind == GRAPH:
                _, now, client, keys, otel, span_of_key, callers, default_id = event
                span_ids: set[str] = set()
                collisions: set[tuple[str, str, str]] = set()
                if out and _large(keys):
                    self._send(out)  # (what came before it, first)
                    out = []
                yield from collect_span_ids(keys, span_of_key, self.tasks, span_ids,
                                            otel=otel, collisions=collisions)
                links: dict[tuple[str, str], dict[str, str]] = {}
                if callers:
                    yield from collect_links(keys, callers, otel, span_of_key,
                                             self.tasks, links, default_id)
                ids = [s for s in span_ids if type(s) is str]
                if self.include_code:
                    self._code_of(ids, out)
                out.append((events.GRAPH, now, client, ids, _chains(otel),
                            sorted(collisions),
                            [(span_id, headers) for (span_id, _), headers
                             in links.items()]))
            elif kind == NOTICE:
                out.append((events.NOTICE, event[1], event[2]))
            elif kind == CLIENT_GONE:
                out.append((events.CLIENT_GONE, event[1], event[2]))
        self._send(out)
        # (after the graphs: their new tasks' groups are touched by then); a group
        # goes when it is done, or when it runs and was not running there
        touched, self.touched = self.touched, set()
        erred, self.erred = self.erred, {}
        running_forwarded = self.running_forwarded
        take_classes = self.sampler.take_erred_classes
        out = [(events.ERRED, tg.span_id, id(tg), n, classes)
               for tg, n in erred.items()
               # (taken for every group: none is left behind)
               for classes in (take_classes(tg),) if tg.span_id is not None]
        for i, tg in enumerate(touched, 1):
            if i % SPANS_PER_STEP == 0:
                self._send(out)
                out = []
                yield
            span_id = tg.span_id
            if span_id is None:
                if group_done(tg):
                    self.sampler.take_erred_window(tg)  # (no span to tell)
                continue
            if group_done(tg):
                running_forwarded.discard(tg)
                out.append((events.DONE, span_id, id(tg),
                            done_figures(tg, self.sampler.take_erred_window(tg))))
                self._tasks_of(tg, span_id, out)
            elif tg not in running_forwarded:
                running_forwarded.add(tg)
                out.append((events.RUN, span_id, id(tg), str(tg.prefix.name)))
            else:
                continue
            self.forwarded_groups += 1
        self._send(out)

    def _tasks_of(self, tg: Any, span_id: str, out: list[tuple[Any, ...]]) -> None:
        """The ``tasks`` message of a group, when the sampler kept some."""
        tasks = self.sampler.take(tg)
        if tasks is not None:
            out.append((events.TASKS, span_id, id(tg), str(tg.prefix.name),
                        *tasks.message_fields()))

    def forward_tasks_left(self) -> None:
        """Forward the tasks kept of groups not done (the scheduler is closing)."""
        out: list[tuple[Any, ...]] = []
        for tg in list(self.sampler.groups):
            if tg.span_id is not None:
                self._tasks_of(tg, tg.span_id, out)
        self.sampler.groups.clear()
        self.sampler.erred_windows.clear()
        self.sampler.erred_classes.clear()
        self._send(out)

    def _code_of(self, span_ids: list[str], out: list[tuple[Any, ...]]) -> None:
        """The code snippets of these spans not forwarded yet (``include-code``)."""
        for span_id in span_ids:
            span = self.spans.get(span_id)
            code = getattr(span, "_code", None)
            if not code:
                continue
            sent = self.code_sent.get(span_id, 0)
            if len(code) > sent:
                self.code_sent[span_id] = len(code)
                out.append((events.CODE, span_id, tuple(islice(code, sent, None))))

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
        self.code_sent.clear()
        self.forwarded_before_adoption = self.forwarded_spans
        positions: dict[str, int] = {}  # span id -> position, of the spans sent
        out: list[tuple[Any, ...]] = []
        for i, span in enumerate(islice(list(self.spans.values()), upto)):
            if i and i % SPANS_PER_STEP == 0:
                if out:
                    self.sink.send(out)
                    out = []
                yield
            if span.id in positions:
                continue
            if all(group_done(tg) for tg in list(span.groups)):
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
            self.sink.send(out)

    def _adopted(self, span: Span, position: int, out: list[tuple[Any, ...]]) -> None:
        """The messages of an adopted span: itself, its groups, its metrics."""
        out.append(span_message(span, position))
        self.forwarded_spans += 1
        for tg in list(span.groups):
            if group_done(tg):
                out.append((events.DONE, span.id, id(tg),
                            done_figures(tg, self.sampler.take_erred_window(tg))))
            else:  # (the ticks need not send it again)
                self.running_forwarded.add(tg)
                out.append((events.RUN, span.id, id(tg), str(tg.prefix.name)))
        metrics = getattr(span, "_cumulative_worker_metrics", None)
        if metrics:
            out.append((events.METRICS, span.id, dict(metrics)))
        if self.include_code:
            self._code_of([span.id], out)


def _large(keys: Any) -> bool:
    """Whether a graph's keys take more than one step."""
    try:
        return len(keys) > SPANS_PER_STEP
    except TypeError:
        return True


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

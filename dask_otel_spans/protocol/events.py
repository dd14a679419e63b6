"""The protocol from the scheduler's forwarder to the export session: every message
that crosses, built by one constructor per kind, and the handler each kind reaches
through one dispatch table made once.

A message is a plain tuple ``(kind, *fields)`` of built-ins, so that the export
process's sender marshals it as it is (a tuple subclass would not marshal: see
:mod:`~dask_otel_spans.protocol.wire`). Its constructor below is the one place that
builds it and says what its fields are; :class:`EventHandler` is what receives it,
one method per kind with the constructor's fields. Both transports (the in-process
thread and the export child process) deliver the same messages to the same
:class:`~dask_otel_spans.export.session.ExportSession`.

Adding a kind: a constant, a constructor, a method of :class:`EventHandler`, a row of
:func:`dispatch_table`, and the handler's method.
"""
from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, TypeAlias

if TYPE_CHECKING:
    from distributed.client import SourceCode
    from typing_extensions import Unpack

    from dask_otel_spans.protocol.snapshots import DoneFigures

#: A message as it crosses: ``(kind, *fields)``, plain built-ins (the fields of each
#: kind are its constructor's parameters)
Message: TypeAlias = "tuple[str, Unpack[tuple[object, ...]]]"
#: A span's source code snippets (``include-code``), as ``Span.code`` lists them
CodeSnippets: TypeAlias = "tuple[tuple[SourceCode, ...], ...]"

#: The kinds (each message's first field)
SPAN, RUN, DONE, ERRED, TASKS = "span", "run", "done", "erred", "tasks"
COUNTS = "counts"
METRICS, CODE, WORKERS = "metrics", "code", "workers"
GRAPH, NOTICE, CLIENT_GONE = "graph", "notice", "client-gone"
DELTAS, WORKER_DELTAS, HISTORY = "deltas", "worker-deltas", "history"


# -- the constructors (the scheduler side builds every message with these) ------------

def span_added(ids: tuple[str, ...], name: tuple[str, ...], enqueued: float,
               nthreads_offset: int, position: int) -> Message:
    """A new dask span: its chain of ids (root first, its own last), its tags, when
    it was enqueued, its offset in ``total_nthreads_history``, and its place in the
    scheduler's span dict (-1 when unknown: an ancestor sent with an adopted span)."""
    return (SPAN, ids, name, enqueued, nthreads_offset, position)


def group_running(span_id: str, group: int, prefix: str) -> Message:
    """A task group of the span has a task in a running state (once when it starts
    to run, or to run again). ``group`` tells the span's groups apart:
    ``id(TaskGroup)`` (the span holds its groups, so no other group of it gets the
    same id; two groups of one name follow each other when the first is forgotten).
    """
    return (RUN, span_id, group, prefix)


def group_done(span_id: str, group: int, figures: DoneFigures) -> Message:
    """Every task of the group is done (settled: in memory, erred, released or
    forgotten); ``figures`` as :func:`~dask_otel_spans.protocol.snapshots.done_figures`:
    the group's, then the earliest start and the latest stop of the compute of its
    tasks that erred since it was last done."""
    return (DONE, span_id, group, figures)


def group_counts(entries: list[tuple[str, int, int, int, int, int]]) -> Message:
    """The tasks by state of running task groups, of those whose counts changed since
    they were last sent: ``[(span id, group, total, erred, running, waiting), ...]``
    (``group`` as in :func:`group_running`, whose message goes first; the counts as
    :func:`~dask_otel_spans.protocol.dask_facts.state_counts`). Sent with a group's
    first ``run`` message, then for every running group at each sweep (every
    ``live.interval``, 1 s at most; :mod:`~dask_otel_spans.scheduler.counts`)."""
    return (COUNTS, entries)


def group_erred(span_id: str, group: int, count: int,
                classes: list[tuple[str | bytes | None, str, int]]) -> Message:
    """``count`` tasks of the group erred since the last tick: counted when they err
    (the group's state counts forget an error once the task is released); the
    exception classes of those that erred while they ran: ``[(what names the class
    (:func:`~dask_otel_spans.protocol.exceptions.exception_class`), type name as
    its ``repr`` gives it, count), ...]``."""
    return (ERRED, span_id, group, count, classes)


def group_tasks(span_id: str, group: int, prefix: str, records: list[tuple[object, ...]],
                erred_seen: int, others_seen: int) -> Message:
    """Tasks of a group chosen for task spans (``task-spans``), forwarded with the
    group: ``records`` as :class:`~dask_otel_spans.protocol.tasks.TaskRecord` tuples,
    and how many erred and finished tasks could have been chosen."""
    return (TASKS, span_id, group, prefix, records, erred_seen, others_seen)


def span_metrics(span_id: str, metrics: dict[Hashable, float]) -> Message:
    """The cumulative fine metrics of a span adopted when the plugin started."""
    return (METRICS, span_id, metrics)


def span_code(span_id: str, code: CodeSnippets) -> Message:
    """Source code snippets the client sent for the span (``include-code``)."""
    return (CODE, span_id, code)


def worker_count(n: int) -> Message:
    """The number of workers changed (the grace period follows it)."""
    return (WORKERS, n)


def graph_submitted(time: float, client: str | None, span_ids: list[str], chains: object,
                    collisions: list[tuple[str, str, str]],
                    links: list[tuple[str, dict[str, str]]]) -> Message:
    """A graph reached the scheduler: the ids of the spans of its tasks, the
    distinct chains of W3C contexts of its ``otel`` annotation, the TaskGroup
    collisions seen in it: ``[(asked span id, span id dask chose, group), ...]``,
    and the links of its bare submissions: ``[(span id dask put them in, the
    caller's W3C headers), ...]``, distinct."""
    return (GRAPH, time, client, span_ids, chains, collisions, links)


def close_notice(time: float, msg: object) -> Message:
    """The client helper's block exited (one notice, or a batch of them)."""
    return (NOTICE, time, msg)


def client_gone(time: float, client: str) -> Message:
    """A client left the scheduler."""
    return (CLIENT_GONE, time, client)


def span_deltas(deltas: Mapping[tuple[Hashable, ...], float]) -> Message:
    """A heartbeat's span metric deltas
    ``{(context, span_id, prefix, activity, unit): value}``."""
    return (DELTAS, deltas)


def worker_deltas(deltas: Mapping[Hashable, float]) -> Message:
    """A heartbeat's worker-wide metric deltas ``{(context, activity, unit): value}``."""
    return (WORKER_DELTAS, deltas)


def nthreads_history(start: int, entries: Sequence[tuple[float, int]]) -> Message:
    """The scheduler's ``total_nthreads_history`` entries from ``start`` on (the
    export process keeps a copy; the in-process session reads the scheduler's)."""
    return (HISTORY, start, tuple(entries))


# -- the receiving side ----------------------------------------------------------------

class EventHandler(Protocol):
    """What receives the messages: one method per kind, with its constructor's
    fields (:class:`~dask_otel_spans.export.session.ExportSession`)."""

    def on_span_added(self, ids: tuple[str, ...], name: tuple[str, ...],
                      enqueued: float, nthreads_offset: int, position: int) -> None: ...

    def on_group_running(self, span_id: str, group: int, prefix: str) -> None: ...

    def on_group_done(self, span_id: str, group: int,
                      figures: DoneFigures) -> None: ...

    def on_group_counts(self,
                        entries: list[tuple[str, int, int, int, int, int]]) -> None: ...

    def on_group_erred(self, span_id: str, group: int, count: int,
                       classes: list[tuple[str | bytes | None, str, int]]) -> None: ...

    def on_group_tasks(self, span_id: str, group: int, prefix: str,
                       records: list[tuple[object, ...]], erred_seen: int,
                       others_seen: int) -> None: ...

    def on_span_metrics(self, span_id: str,
                        metrics: Mapping[Hashable, float]) -> None: ...

    def on_span_code(self, span_id: str, code: CodeSnippets) -> None: ...

    def on_worker_count(self, n: int) -> None: ...

    def on_graph_submitted(self, time: float, client: str | None, span_ids: list[str],
                           chains: object, collisions: list[tuple[str, str, str]],
                           links: list[tuple[str, dict[str, str]]]) -> None: ...

    def on_close_notice(self, time: float, msg: object) -> None: ...

    def on_client_gone(self, time: float, client: str) -> None: ...

    def on_span_deltas(self, deltas: Mapping[Hashable, float]) -> None: ...

    def on_worker_deltas(self, deltas: Mapping[Hashable, float]) -> None: ...

    def on_nthreads_history(self, start: int,
                            entries: Sequence[tuple[float, int]]) -> None: ...


def dispatch_table(handler: EventHandler) -> dict[str, tuple[int, Callable[..., None]]]:
    """kind -> (number of fields, ``handler``'s bound method for it): each row names
    the kind's constructor, whose parameters the method takes."""
    rows: tuple[tuple[str, Callable[..., Message], Callable[..., None]], ...] = (
        (SPAN, span_added, handler.on_span_added),
        (RUN, group_running, handler.on_group_running),
        (DONE, group_done, handler.on_group_done),
        (COUNTS, group_counts, handler.on_group_counts),
        (ERRED, group_erred, handler.on_group_erred),
        (TASKS, group_tasks, handler.on_group_tasks),
        (METRICS, span_metrics, handler.on_span_metrics),
        (CODE, span_code, handler.on_span_code),
        (WORKERS, worker_count, handler.on_worker_count),
        (GRAPH, graph_submitted, handler.on_graph_submitted),
        (NOTICE, close_notice, handler.on_close_notice),
        (CLIENT_GONE, client_gone, handler.on_client_gone),
        (DELTAS, span_deltas, handler.on_span_deltas),
        (WORKER_DELTAS, worker_deltas, handler.on_worker_deltas),
        (HISTORY, nthreads_history, handler.on_nthreads_history),
    )
    return {kind: (constructor.__code__.co_argcount, method)
            for kind, constructor, method in rows}


class UnknownMessage(ValueError):
    """A message whose kind or number of fields is not the protocol's."""


class Dispatcher:
    """Applies messages to a handler, through :func:`dispatch_table` made once."""

    __slots__ = ("_table",)

    def __init__(self, handler: EventHandler):
        self._table = dispatch_table(handler)

    def __call__(self, message: Message) -> None:
        """Call the handler's method for ``message`` with its fields; raises
        :class:`UnknownMessage` for a message that is not of the protocol."""
        try:
            arity, method = self._table[message[0]]
        except (KeyError, IndexError, TypeError):
            raise UnknownMessage(
                f"not a message of the protocol: {message!r:.200}") from None
        if len(message) != arity + 1:
            raise UnknownMessage(
                f"{message[0]!r} takes {arity} fields, got {len(message) - 1}")
        method(*message[1:])

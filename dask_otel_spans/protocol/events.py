"""The protocol from the scheduler's forwarder to the export session: every message
that crosses, its fields, and the one table that dispatches it.

A message is a plain tuple ``(kind, *fields)`` of built-ins, so that the export
process's sender can marshal it as it is; the named tuples below document the
fields of each kind, in order, and :func:`dispatch` calls the handler's method for
it with those fields. Both transports (the in-process thread and the export child
process) deliver the same messages to the same
:class:`~dask_otel_spans.export.session.ExportSession`.
"""
from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any, NamedTuple


class SpanAdded(NamedTuple):
    """A new dask span: its chain of ids (root first, its own last), its tags, when
    it was enqueued, its offset in ``total_nthreads_history``, and its place in the
    scheduler's span dict (-1 when unknown: an ancestor sent with an adopted span)."""

    ids: tuple[str, ...]
    name: tuple[str, ...]
    enqueued: float
    nthreads_offset: int
    position: int


class GroupRunning(NamedTuple):
    """A task group of the span has a task in a running state (once when it starts
    to run, or to run again). ``group`` tells the span's groups apart:
    ``id(TaskGroup)`` (the span holds its groups, so no other group of it gets the
    same id; two groups of one name follow each other when the first is forgotten).
    """

    span_id: str
    group: int
    prefix: str


class GroupDone(NamedTuple):
    """Every task of the group settled; ``figures`` as
    :func:`~dask_otel_spans.protocol.snapshots.done_figures`: the group's, then the earliest
    start and the latest stop of the compute of its tasks that erred since it was
    last done."""

    span_id: str
    group: int
    figures: tuple[Any, ...]


class GroupErred(NamedTuple):
    """``count`` tasks of the group erred since the last tick: counted when they err
    (the group's state counts forget an error once the task is released); the
    exception classes of those that erred while they ran: ``[(what names the class
    (:func:`~dask_otel_spans.protocol.exceptions.exception_class`), type name as
    its ``repr`` gives it, count), ...]``."""

    span_id: str
    group: int
    count: int
    classes: list[tuple[Any, str, int]]


class GroupTasks(NamedTuple):
    """Tasks of a group chosen for task spans (``task-spans``), forwarded with the
    group: ``records`` as :class:`~dask_otel_spans.protocol.tasks.TaskRecord` tuples,
    and how many erred and finished tasks could have been chosen."""

    span_id: str
    group: int
    prefix: str
    records: list[tuple[Any, ...]]
    erred_seen: int
    others_seen: int


class SpanMetrics(NamedTuple):
    """The cumulative fine metrics of a span adopted when the plugin started."""

    span_id: str
    metrics: dict[Hashable, float]


class SpanCode(NamedTuple):
    """Source code snippets the client sent for the span (``include-code``)."""

    span_id: str
    code: tuple[Any, ...]


class WorkerCount(NamedTuple):
    """The number of workers changed (the grace period follows it)."""

    n: int


class GraphSubmitted(NamedTuple):
    """A graph reached the scheduler: the ids of the spans of its tasks, the
    distinct chains of W3C contexts of its ``otel`` annotation, the TaskGroup
    collisions seen in it: ``[(asked span id, span id dask chose, group), ...]``,
    and the links of its bare submissions: ``[(span id dask put them in, the
    caller's W3C headers), ...]``, distinct."""

    time: float
    client: str | None
    span_ids: list[str]
    chains: Any
    collisions: list[tuple[str, str, str]]
    links: list[tuple[str, dict[str, str]]]


class CloseNotice(NamedTuple):
    """The client helper's block exited (one notice, or a batch of them)."""

    time: float
    msg: Any


class ClientGone(NamedTuple):
    """A client left the scheduler."""

    time: float
    client: str


class SpanDeltas(NamedTuple):
    """A heartbeat's span metric deltas
    ``{(context, span_id, prefix, activity, unit): value}``."""

    deltas: Mapping[Hashable, float]


class WorkerDeltas(NamedTuple):
    """A heartbeat's worker-wide metric deltas ``{(context, activity, unit): value}``."""

    deltas: Mapping[Hashable, float]


class NthreadsHistory(NamedTuple):
    """The scheduler's ``total_nthreads_history`` entries from ``start`` on (the
    export process keeps a copy; the in-process session reads the scheduler's)."""

    start: int
    entries: tuple[tuple[float, int], ...]


#: The kinds, by name, for the code that makes messages
SPAN, RUN, DONE, ERRED, TASKS = "span", "run", "done", "erred", "tasks"
METRICS, CODE, WORKERS = "metrics", "code", "workers"
GRAPH, NOTICE, CLIENT_GONE = "graph", "notice", "client-gone"
DELTAS, WORKER_DELTAS, HISTORY = "deltas", "worker-deltas", "history"

#: kind -> (fields, name of the handler's method)
TABLE: dict[str, tuple[type[tuple], str]] = {
    SPAN: (SpanAdded, "on_span"),
    RUN: (GroupRunning, "on_group_running"),
    DONE: (GroupDone, "on_group_done"),
    ERRED: (GroupErred, "on_group_erred"),
    TASKS: (GroupTasks, "on_group_tasks"),
    METRICS: (SpanMetrics, "on_span_metrics"),
    CODE: (SpanCode, "on_span_code"),
    WORKERS: (WorkerCount, "on_worker_count"),
    GRAPH: (GraphSubmitted, "on_graph"),
    NOTICE: (CloseNotice, "on_close_notice"),
    CLIENT_GONE: (ClientGone, "on_client_gone"),
    DELTAS: (SpanDeltas, "on_span_deltas"),
    WORKER_DELTAS: (WorkerDeltas, "on_worker_deltas"),
    HISTORY: (NthreadsHistory, "on_nthreads_history"),
}


class UnknownMessage(ValueError):
    """A message whose kind or number of fields is not the protocol's."""


def dispatch(handler: Any, message: tuple[Any, ...]) -> None:
    """Call ``handler.<method>(*fields)`` for ``message``, as :data:`TABLE` says."""
    try:
        fields, method = TABLE[message[0]]
    except (KeyError, IndexError, TypeError):
        raise UnknownMessage(f"not a message of the protocol: {message!r:.200}")
    if len(message) != len(fields._fields) + 1:
        raise UnknownMessage(
            f"{message[0]!r} takes {len(fields._fields)} fields, got "
            f"{len(message) - 1}"
        )
    getattr(handler, method)(*message[1:])

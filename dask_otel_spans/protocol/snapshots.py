"""What the translation reads of a dask span and its task groups: plain-data copies,
taken at one instant (of the scheduler's ``TaskGroup`` on the event loop, of the span
tree copy on the export side), that can cross threads and processes."""
from __future__ import annotations

from collections.abc import Container, Hashable, Sequence
from typing import TYPE_CHECKING, NamedTuple, TypeAlias, Union

from dask_otel_spans.protocol.dask_private import (
    cumulative_metrics,
    nthreads_history,
    nthreads_offset,
)
from dask_otel_spans.protocol.tasks import TaskRecord

if TYPE_CHECKING:
    from distributed.client import SourceCode
    from distributed.scheduler import TaskGroup
    from distributed.spans import Span

#: A group's :class:`GroupSnapshot` fields but ``errors``, as a plain tuple
#: (:func:`snapshot_group`): prefix, start, stop, nbytes_total, duration, task_count,
#: erred_count
GroupFields: TypeAlias = tuple[str, float, float, int, float, int, int]
#: The figures of a ``done`` message (:func:`done_figures`): those of
#: :data:`GroupFields`, then the erred tasks' earliest start and latest stop
DoneFigures: TypeAlias = tuple[str, float, float, int, float, int, int, float, float]


class GroupSnapshot(NamedTuple):
    """The figures of one ``TaskGroup`` that the translation reads (forwarded as a
    plain tuple of these fields, in this order: :func:`snapshot_group`)."""

    prefix: str
    #: earliest start and latest stop of its tasks' compute; copied from the span
    #: tree copy, those of its tasks that erred included (see :func:`done_figures`)
    start: float
    stop: float
    nbytes_total: int
    duration: float
    task_count: int
    erred_count: int
    #: ``(exception.type, count)`` of its tasks that erred while they ran, most
    #: frequent first (the export side's copy knows them; empty from a
    #: scheduler's ``TaskGroup``)
    errors: tuple[tuple[str, int], ...] = ()


def _errors_of(tg: TaskGroup) -> tuple[tuple[str, int], ...]:
    errors = getattr(tg, "errors", None)
    if not errors:
        return ()
    return tuple(sorted(errors.items(), key=lambda item: (-item[1], item[0])))


#: A child that is copied, or the id of a child whose subtree summary the exporting
#: side already holds (handed over earlier)
ChildSnapshot = Union["SpanSnapshot", str]


class SpanSnapshot(NamedTuple):
    """What the translation needs of one dask span, copied at one instant."""

    id: str
    name: tuple[str, ...]
    enqueued: float
    groups: tuple[GroupSnapshot, ...]
    #: the span's own ``_cumulative_worker_metrics`` (without its children's)
    metrics: dict[Hashable, float]
    children: tuple[ChildSnapshot, ...]
    #: ``Span.code`` when asked for, else empty
    code: tuple[tuple[SourceCode, ...], ...]
    #: reference to the (append-only) ``total_nthreads_history`` the span reads
    nthreads_history: Sequence[tuple[float, int]]
    nthreads_offset: int
    #: prefix -> (the tasks that get task spans, how many were left out past the cap)
    tasks: dict[str, tuple[list[TaskRecord], int]] = {}


def snapshot_group(tg: TaskGroup) -> GroupFields:
    """A ``TaskGroup``'s :class:`GroupSnapshot` fields as a plain tuple."""
    states = tg.states
    # (prefix, start, stop, nbytes_total, duration, task_count, erred_count)
    return (
        str(tg.prefix.name),
        tg.start,
        tg.stop,
        tg.nbytes_total,
        tg.duration,
        sum(states.values()),
        states.get("erred", 0),
    )


def done_figures(tg: TaskGroup, erred_window: tuple[float, float]) -> DoneFigures:
    """The figures of a done ``TaskGroup`` as the ``done`` message carries them:
    :func:`snapshot_group`'s, then ``erred_window``, the earliest start and the
    latest stop of the compute of its tasks that erred (``(0.0, 0.0)`` when none
    reported one): dask's ``start`` and ``stop`` count the tasks that finished
    only."""
    return (*snapshot_group(tg), *erred_window)



def snapshot_span(
    span: Span, summarized: Container[str] = (), *, with_code: bool = False
) -> SpanSnapshot:
    """Copy ``span`` and, recursively, those of its children not in ``summarized``
    (the exporting side holds the subtree summaries of those: only their ids are
    listed).

    Cost: one C-level dict copy of the span's metrics plus a few attribute reads per
    task group and per copied child.
    """
    groups = tuple(GroupSnapshot._make((*snapshot_group(tg), _errors_of(tg)))
                   for tg in list(span.groups))
    children = tuple(
        child.id if child.id in summarized else snapshot_span(child, summarized)
        for child in list(span.children)
    )
    return SpanSnapshot(
        span.id,
        tuple(span.name),
        span.enqueued,
        groups,
        dict(cumulative_metrics(span)),
        children,
        tuple(span.code) if with_code else (),
        nthreads_history(span),
        nthreads_offset(span),
        {
            prefix: (sample.chosen(), sample.left_out)
            for prefix, sample in (getattr(span, "task_samples", None) or {}).items()
        },
    )

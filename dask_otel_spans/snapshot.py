"""Plain-data copies of dask ``Span`` objects, taken on the scheduler's event loop so
that translating and exporting them can run on another thread.

A copy is made as plain tuples (the *plain form*: built-ins only, so that the export
process's sender can marshal it as it is); :func:`restore_snapshot` gives the named
view (:class:`SpanSnapshot`, :class:`GroupSnapshot`) that the translation reads."""
from __future__ import annotations

from collections.abc import Container, Generator, Hashable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Union

if TYPE_CHECKING:
    from distributed.spans import Span


class GroupSnapshot(NamedTuple):
    """The figures of one ``TaskGroup`` that the translation reads (copied on the
    event loop as a plain tuple of these fields, in this order)."""

    prefix: str
    start: float
    stop: float
    nbytes_total: int
    duration: float
    task_count: int
    erred_count: int


#: A child that is copied, or the id of a child whose subtree summary the exporting
#: side already holds (emitted earlier)
ChildSnapshot = Union["SpanSnapshot", str]


class SpanSnapshot(NamedTuple):
    """What the translation needs of one dask span, copied at one instant (on the
    event loop as a plain tuple of these fields, in this order, its groups and
    copied children in their plain form too)."""

    id: str
    name: tuple[str, ...]
    enqueued: float
    groups: tuple[GroupSnapshot, ...]
    #: the span's own ``_cumulative_worker_metrics`` (without its children's)
    metrics: dict[Hashable, float]
    children: tuple[ChildSnapshot, ...]
    #: ``Span.code`` when asked for, else empty
    code: tuple[Any, ...]
    #: reference to the scheduler's append-only ``total_nthreads_history``, or
    #: :data:`MIRRORED_HISTORY` (None in the plain form)
    nthreads_history: Sequence[tuple[float, int]]
    nthreads_offset: int


#: A span snapshot or a group's figures in their plain form (see the module)
PlainSnapshot = tuple


class _MirroredHistory(tuple):
    """An empty history that pickles as a reference to :data:`MIRRORED_HISTORY`
    (so that the export process tells it from any other empty history)."""

    __slots__ = ()

    def __reduce__(self) -> str:
        return "MIRRORED_HISTORY"


#: ``nthreads_history`` of copies sent to the export process, instead of a reference
#: to the scheduler's (append-only, ever-growing) ``total_nthreads_history``: the
#: sender sends that list's new entries once, and the export process keeps a copy
#: of it (:func:`~dask_otel_spans.wire.restored_request`). Passed to the copy
#: functions, it makes the plain form hold None there; restored, it is this marker.
MIRRORED_HISTORY: tuple[tuple[float, int], ...] = _MirroredHistory()


def snapshot_group(tg: Any) -> PlainSnapshot:
    """The plain form of a ``TaskGroup``'s :class:`GroupSnapshot`."""
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


#: Task groups copied between two pauses of :func:`iter_snapshot_span` (a few µs each)
GROUPS_PER_STEP = 128
#: Children listed between two pauses of :func:`iter_snapshot_span` (~1 µs each)
CHILDREN_PER_STEP = 512


def snapshot_span(
    span: Span,
    summarized: Container[str] = (),
    *,
    with_code: bool = False,
    nthreads_history: Sequence[tuple[float, int]] | None = None,
) -> SpanSnapshot:
    """Copy ``span`` and, recursively, those of its children not in ``summarized``,
    as the named view (:func:`iter_snapshot_span` and :func:`snapshot_in_one_step`,
    which the plugin calls on the event loop, give the plain form).

    Cost: one C-level dict copy of the span's metrics plus a few attribute reads per
    task group and per copied child; no string formatting.

    ``nthreads_history``, when given, stands for the spans' reference to the
    scheduler's ``total_nthreads_history`` (e.g. :data:`MIRRORED_HISTORY`).
    """
    copy = snapshot_in_one_step(
        span, with_code=with_code, nthreads_history=nthreads_history
    )
    if copy is None:
        steps = iter_snapshot_span(
            span, summarized, with_code=with_code, nthreads_history=nthreads_history
        )
        while copy is None:
            try:
                next(steps)
            except StopIteration as done:
                copy = done.value
    return restore_snapshot(copy)


def restore_snapshot(plain: PlainSnapshot | str) -> SpanSnapshot | str:
    """The named view of a copy in its plain form, its groups and copied children
    too (a child's id stays as it is; a named view is returned as it is)."""
    if type(plain) is str or type(plain) is SpanSnapshot:
        return plain
    span_id, name, enqueued, groups, metrics, children, code, history, offset = plain
    return SpanSnapshot(
        span_id, name, enqueued, tuple(map(GroupSnapshot._make, groups)), metrics,
        tuple(map(restore_snapshot, children)), code,
        MIRRORED_HISTORY if history is None else history, offset,
    )


def iter_snapshot_span(
    span: Span,
    summarized: Container[str] = (),
    *,
    with_code: bool = False,
    nthreads_history: Sequence[tuple[float, int]] | None = None,
) -> Generator[None, None, PlainSnapshot]:
    """:func:`snapshot_span`'s plain form, in steps: pauses (yields) after every
    ``GROUPS_PER_STEP`` task groups and ``CHILDREN_PER_STEP`` children, so that
    copying a span of thousands of task groups or children can be cut into
    event-loop slices; returns the snapshot.

    Task groups and children are listed at the start (a C-level copy), so the spans
    may change between steps; each group's figures are read at its own step.
    """
    groups: list[PlainSnapshot] = []
    tgs = list(span.groups)
    for start in range(0, len(tgs), GROUPS_PER_STEP):
        if start:
            yield
        groups.extend(map(snapshot_group, tgs[start : start + GROUPS_PER_STEP]))
    children: list[PlainSnapshot | str] = []
    for i, child in enumerate(list(span.children), 1):
        if i % CHILDREN_PER_STEP == 0:
            yield
        if child.id in summarized:
            children.append(child.id)
        else:
            children.append((yield from iter_snapshot_span(
                child, summarized, nthreads_history=nthreads_history
            )))
    return _copy(span, tuple(groups), tuple(children), with_code, nthreads_history)


def snapshot_in_one_step(
    span: Span,
    *,
    with_code: bool = False,
    nthreads_history: Sequence[tuple[float, int]] | None = None,
) -> PlainSnapshot | None:
    """:func:`snapshot_span`'s plain form, of a span without children and of at most
    ``GROUPS_PER_STEP`` task groups (most spans, when they are emitted before
    their parents), without the steps' generators; None for any other span."""
    if span.children or len(span.groups) > GROUPS_PER_STEP:
        return None
    groups = tuple(map(snapshot_group, span.groups))
    return _copy(span, groups, (), with_code, nthreads_history)


def _copy(
    span: Span,
    groups: tuple[PlainSnapshot, ...],
    children: tuple[PlainSnapshot | str, ...],
    with_code: bool,
    nthreads_history: Sequence[tuple[float, int]] | None,
) -> PlainSnapshot:
    if nthreads_history is None:
        nthreads_history = getattr(span, "_total_nthreads_history", ())
    elif nthreads_history is MIRRORED_HISTORY:
        nthreads_history = None
    # (id, name, enqueued, groups, metrics, children, code, nthreads_history,
    # nthreads_offset)
    return (
        span.id,
        tuple(span.name),
        span.enqueued,
        groups,
        dict(getattr(span, "_cumulative_worker_metrics", None) or {}),
        children,
        tuple(span.code) if with_code else (),
        nthreads_history,
        getattr(span, "_total_nthreads_offset", 0),
    )

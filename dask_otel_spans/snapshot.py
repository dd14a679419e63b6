"""Plain-data copies of dask ``Span`` objects, taken on the scheduler's event loop so
that translating and exporting them can run on another thread."""
from __future__ import annotations

from collections.abc import Container, Generator, Hashable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Union

if TYPE_CHECKING:
    from distributed.spans import Span


class GroupSnapshot(NamedTuple):
    """The figures of one ``TaskGroup`` that the translation reads (a named tuple:
    spans can have thousands of groups, copied on the event loop)."""

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
    """What the translation needs of one dask span, copied at one instant (a named
    tuple, as :class:`GroupSnapshot`: one is copied on the event loop for every
    span)."""

    id: str
    name: tuple[str, ...]
    enqueued: float
    groups: tuple[GroupSnapshot, ...]
    #: the span's own ``_cumulative_worker_metrics`` (without its children's)
    metrics: dict[Hashable, float]
    children: tuple[ChildSnapshot, ...]
    #: ``Span.code`` when asked for, else empty
    code: tuple[Any, ...]
    #: reference to the scheduler's append-only ``total_nthreads_history``
    nthreads_history: Sequence[tuple[float, int]]
    nthreads_offset: int


#: ``tuple.__new__``: a named tuple from a tuple of its fields in order, without its
#: Python-level ``__new__`` (a quarter of the cost, for every group and span copied
#: on the event loop)
_new_tuple = tuple.__new__


def snapshot_group(tg: Any) -> GroupSnapshot:
    states = tg.states
    # (prefix, start, stop, nbytes_total, duration, task_count, erred_count)
    return _new_tuple(GroupSnapshot, (
        str(tg.prefix.name),
        tg.start,
        tg.stop,
        tg.nbytes_total,
        tg.duration,
        sum(states.values()),
        states.get("erred", 0),
    ))


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
    """Copy ``span`` and, recursively, those of its children not in ``summarized``.

    Cost: one C-level dict copy of the span's metrics plus a few attribute reads per
    task group and per copied child; no string formatting.

    ``nthreads_history``, when given, stands for the spans' reference to the
    scheduler's ``total_nthreads_history`` (e.g.
    :data:`~dask_otel_spans.wire.MIRRORED_HISTORY`).
    """
    copy = snapshot_in_one_step(
        span, with_code=with_code, nthreads_history=nthreads_history
    )
    if copy is not None:
        return copy
    steps = iter_snapshot_span(
        span, summarized, with_code=with_code, nthreads_history=nthreads_history
    )
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def iter_snapshot_span(
    span: Span,
    summarized: Container[str] = (),
    *,
    with_code: bool = False,
    nthreads_history: Sequence[tuple[float, int]] | None = None,
) -> Generator[None, None, SpanSnapshot]:
    """:func:`snapshot_span` in steps: pauses (yields) after every
    ``GROUPS_PER_STEP`` task groups and ``CHILDREN_PER_STEP`` children, so that
    copying a span of thousands of task groups or children can be cut into
    event-loop slices; returns the snapshot.

    Task groups and children are listed at the start (a C-level copy), so the spans
    may change between steps; each group's figures are read at its own step.
    """
    groups: list[GroupSnapshot] = []
    tgs = list(span.groups)
    for start in range(0, len(tgs), GROUPS_PER_STEP):
        if start:
            yield
        groups.extend(map(snapshot_group, tgs[start : start + GROUPS_PER_STEP]))
    children: list[ChildSnapshot] = []
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
) -> SpanSnapshot | None:
    """:func:`snapshot_span` of a span without children and of at most
    ``GROUPS_PER_STEP`` task groups (most spans, when they are emitted before
    their parents), without the steps' generators; None for any other span."""
    if span.children or len(span.groups) > GROUPS_PER_STEP:
        return None
    groups = tuple(map(snapshot_group, span.groups))
    return _copy(span, groups, (), with_code, nthreads_history)


def _copy(
    span: Span,
    groups: tuple[GroupSnapshot, ...],
    children: tuple[ChildSnapshot, ...],
    with_code: bool,
    nthreads_history: Sequence[tuple[float, int]] | None,
) -> SpanSnapshot:
    # (id, name, enqueued, groups, metrics, children, code, nthreads_history,
    # nthreads_offset)
    return _new_tuple(SpanSnapshot, (
        span.id,
        tuple(span.name),
        span.enqueued,
        groups,
        dict(getattr(span, "_cumulative_worker_metrics", None) or {}),
        children,
        tuple(span.code) if with_code else (),
        (
            getattr(span, "_total_nthreads_history", ())
            if nthreads_history is None
            else nthreads_history
        ),
        getattr(span, "_total_nthreads_offset", 0),
    ))

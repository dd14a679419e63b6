"""Plain-data copies of dask ``Span`` objects, taken on the scheduler's event loop so
that translating and exporting them can run on another thread."""
from __future__ import annotations

from collections.abc import Container, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Union

if TYPE_CHECKING:
    from distributed.spans import Span


@dataclass(frozen=True)
class GroupSnapshot:
    """The figures of one ``TaskGroup`` that the translation reads."""

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


@dataclass(frozen=True)
class SpanSnapshot:
    """What the translation needs of one dask span, copied at one instant."""

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


def snapshot_group(tg: Any) -> GroupSnapshot:
    states = tg.states
    return GroupSnapshot(
        prefix=str(tg.prefix.name),
        start=tg.start,
        stop=tg.stop,
        nbytes_total=tg.nbytes_total,
        duration=tg.duration,
        task_count=sum(states.values()),
        erred_count=states.get("erred", 0),
    )


def snapshot_span(
    span: Span, summarized: Container[str] = (), *, with_code: bool = False
) -> SpanSnapshot:
    """Copy ``span`` and, recursively, those of its children not in ``summarized``.

    Cost: one C-level dict copy of the span's metrics plus a few attribute reads per
    task group and per copied child; no string formatting.
    """
    return SpanSnapshot(
        id=span.id,
        name=tuple(span.name),
        enqueued=span.enqueued,
        groups=tuple(map(snapshot_group, span.groups)),
        metrics=dict(getattr(span, "_cumulative_worker_metrics", None) or {}),
        children=tuple(
            child.id
            if child.id in summarized
            else snapshot_span(child, summarized)
            for child in span.children
        ),
        code=tuple(span.code) if with_code else (),
        nthreads_history=getattr(span, "_total_nthreads_history", ()),
        nthreads_offset=getattr(span, "_total_nthreads_offset", 0),
    )

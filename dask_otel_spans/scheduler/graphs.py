"""What a graph's annotations say, read on the event loop in steps: the dask spans its
tasks are in, the TaskGroup collisions of its ``span()`` blocks, and the callers of its
bare submissions (the links of the spans they land in)."""
from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, TypedDict

from distributed.utils import key_split_group

from dask_otel_spans.protocol.propagation import w3c_headers

if TYPE_CHECKING:
    from dask.typing import Key
    from distributed.scheduler import TaskState

#: Keys read between two pauses (~1 µs each)
KEYS_PER_STEP = 256


class SpanAnnotation(TypedDict):
    """A task's ``span`` annotation, as ``distributed.span`` sets it."""

    #: the tags of the span and its ancestors, root first
    name: tuple[str, ...]
    #: the ids of the span and its ancestors, root first
    ids: tuple[str, ...]


# (a loop per key of a graph on the event loop: kept in one function, no call per key)
def collect_span_ids(keys: Iterable[Key],  # noqa: C901
                     span_of_key: Mapping[Key, SpanAnnotation] | None,
                     tasks: Mapping[Key, TaskState],
                     span_ids: set[str], step: int = KEYS_PER_STEP, *,
                     otel: Mapping[Key, object] | None = None,
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
                if otel is not None and collisions is not None:
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


# (a loop per key of a graph on the event loop: kept in one function, no call per key)
def collect_links(keys: Iterable[Key],  # noqa: C901
                  callers: Mapping[Key, object] | None,
                  otel: Mapping[Key, object] | None,
                  span_of_key: Mapping[Key, SpanAnnotation] | None,
                  tasks: Mapping[Key, TaskState],
                  links: dict[tuple[str, str], dict[str, str]],
                  default_id: str | None = None,
                  step: int = KEYS_PER_STEP) -> Iterator[None]:
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


def _note_collision(key: Key, ann: SpanAnnotation, chain: object,
                    tasks: Mapping[Key, TaskState],
                    collisions: set[tuple[str, str, str]]) -> None:
    """Add the collision of ``key``'s tasks to ``collisions``, if there is one (a
    malformed chain says nothing: the export session says it is malformed)."""
    if not isinstance(chain, Mapping) or not chain:
        return
    try:
        asked = next(reversed(list(chain)))
        ids = tuple(ann["ids"])
    except Exception:
        return
    if asked in ids:
        return  # the asked span, or a plain distributed.span inside it
    ts = tasks.get(key)
    # (a task released by now: its group is named after its key, as dask does)
    group = str(ts.group.name) if ts is not None else key_split_group(key)
    collisions.add((str(asked), str(ids[-1]), group))


def large(keys: Collection[Key]) -> bool:
    """Whether a graph's keys take more than one step."""
    try:
        return len(keys) > KEYS_PER_STEP
    except TypeError:
        return True


def distinct_chains(otel: object) -> object:
    """The distinct chains of an ``otel`` annotation (one value object per chain of
    spans; a graph of many tasks of one chain carries it once): the annotation as
    it came when it is not a mapping (the export process says it is malformed)."""
    if not isinstance(otel, Mapping):
        return otel
    seen: dict[int, object] = {}
    for value in otel.values():
        seen.setdefault(id(value), value)
    return list(seen.values())

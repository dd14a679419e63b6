"""The readiness tracker's record of one dask span that was not handed over yet."""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from dask_otel_spans import names
from dask_otel_spans.protocol.propagation import w3c_headers

if TYPE_CHECKING:
    from distributed.scheduler import TaskGroup
    from distributed.spans import Span


class CallerLinks:
    """The distinct callers' W3C headers of bare submissions that landed in one
    span: the first ``names.MAX_SPAN_LINKS`` kept, the others counted."""

    __slots__ = ("_kept", "dropped")

    def __init__(self) -> None:
        self._kept: dict[str, dict[str, str]] | None = None
        #: distinct callers not kept, past the cap
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._kept) if self._kept is not None else 0

    def add(self, headers: dict[str, str]) -> None:
        """A caller's headers (``traceparent`` and maybe ``tracestate``)."""
        kept = self._kept
        if kept is None:
            kept = self._kept = {}
        traceparent = headers["traceparent"]
        if traceparent in kept:
            return
        if len(kept) < names.MAX_SPAN_LINKS:
            kept[traceparent] = headers
        else:
            # (a caller counted twice past the cap is counted twice: remembering
            # every one would make memory follow the callers)
            self.dropped += 1

    def kept(self) -> tuple[dict[str, str], ...]:
        """The kept callers' headers, in the order they came."""
        return tuple(self._kept.values()) if self._kept else ()


class OpenSpan:
    """Bookkeeping of one dask span that was not handed over yet.

    Parameters
    ----------
    dask_id:
        The span's id
    tags:
        Its tags (``Span.name``)
    ids:
        Its chain of dask span ids, root first
    """

    __slots__ = (
        "id", "tags", "ids", "span", "carried", "links", "helper", "closed_at",
        "close_reason",
        "last_activity", "done_since", "finished_at", "clients", "client_gone",
        "enter", "exit", "counted", "depth", "submitted", "awaiting_graph",
        "open_children", "children_finished_at", "children_handed_over", "wake_at",
        "unfinished_group", "unfinished_child",
    )

    def __init__(self, dask_id: str, tags: tuple[str, ...], ids: tuple[str, ...]):
        self.id = dask_id
        self.tags = tags
        self.ids = ids
        #: the tree's Span; None until the scheduler has tasks of it
        self.span: Span | None = None
        #: W3C headers carried from the client for ids of the chain, as sent
        self.carried: dict[str, object] = {}
        #: callers of bare submissions whose tasks dask put in it
        self.links = CallerLinks()
        #: opened by the client helper: wait for its close notice
        self.helper = False
        self.closed_at: float | None = None
        self.close_reason = names.CLOSE_REASON_IDLE
        self.last_activity = 0.0
        self.done_since: float | None = None
        #: when the last task of its tree finished, as worked out when it was judged
        #: done (valid while ``done_since`` is set)
        self.finished_at = 0.0
        self.clients: set[str] = set()
        self.client_gone = False
        #: client-side enter/exit times (from the close notice)
        self.enter: float | None = None
        self.exit: float | None = None
        #: counted in dask.span.active
        self.counted = False
        self.depth = len(ids)
        #: a graph carrying its annotation reached the scheduler (its tasks may sit
        #: in another span's TaskGroup: distributed's TaskGroup collision)
        self.submitted = False
        #: closed before the scheduler saw it, and the client said collections
        #: built in the block are still to be computed: their graph will bring it
        self.awaiting_graph = False
        #: children not handed over yet (a check looks at the open children only)
        self.open_children: set[str] = set()
        #: when the last task of the handed-over children finished, and how many
        #: were (they are no longer among its span's children)
        self.children_finished_at = 0.0
        self.children_handed_over = 0
        #: when a pass looks at it again, unless something changes first
        self.wake_at: float | None = None
        #: a TaskGroup found not done by the last check: looked at first
        self.unfinished_group: TaskGroup | None = None
        #: id of an open child found not done (or closed, and so handed over before
        #: it) by the last check: looked at first
        self.unfinished_child: str | None = None

    @property
    def waits_for_graph(self) -> bool:
        """Closed before the scheduler saw it, and its graph is still to come."""
        return self.span is None and self.awaiting_graph and not (
            self.submitted or self.client_gone
        )


def carried_for_translation(rec: OpenSpan, root: OpenSpan | None) -> dict[str, object]:
    """The carried headers the translation reads of a span: the root's (the open
    ``root`` record's, which fixes the tree's trace; else the copy ``rec`` holds) and
    its own; empty carriers left out (they say what no carrier says)."""
    ids, carried = rec.ids, rec.carried
    root_id, own_id = ids[0], rec.id
    sent = {}
    carrier = carried.get(own_id)
    if carrier is not None and (type(carrier) is not dict or carrier):
        sent[own_id] = carrier
    if root_id != own_id:
        carrier = root.carried.get(root_id) if root is not None else None
        if carrier is None:
            carrier = carried.get(root_id)
        if carrier is not None and (type(carrier) is not dict or carrier):
            sent[root_id] = carrier
    return sent


def merge_carried(rec: OpenSpan, carried: Mapping[str, object],
                  open_records: Mapping[str, OpenSpan]) -> None:
    """Take what a graph or a close notice carried for the chain of ``rec``: the
    first carrier of each span stays (what opened it; ids never change once
    given), a later one of its own that names another span becomes one of its
    links (:class:`CallerLinks`). A root that learns its own carrier here tells
    its open descendants (of ``open_records``), which read it from their copy once
    the root is handed over."""
    known = rec.carried
    root_id = rec.ids[0]
    learned_root = False
    for dask_id, carrier in carried.items():
        before = known.get(dask_id)
        if before is None:
            if dask_id not in known:
                known[dask_id] = carrier
                learned_root = learned_root or dask_id == root_id
            continue
        if dask_id == rec.id and carrier is not before and carrier != before:
            headers = w3c_headers(carrier)
            if headers is not None and headers != w3c_headers(before):
                rec.links.add(headers)
    if learned_root and rec.depth == 1 and rec.open_children:
        below = list(rec.open_children)
        while below:
            child = open_records.get(below.pop())
            if child is not None and child.ids[0] == root_id:
                child.carried.setdefault(root_id, known[root_id])
                below.extend(child.open_children)

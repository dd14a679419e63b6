"""Which open spans the readiness tracker checks next, and when: a queue of spans to
check (deepest first, so that children go before their parents) and their wake-ups."""
from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Mapping

from dask_otel_spans.export.tracking.records import OpenSpan


class CheckSchedule:
    """Spans to check in the next pass, and the times at which waiting spans are to
    be checked again (O(log n) each)."""

    def __init__(self) -> None:
        #: open spans to check in the next pass, deepest first: (-depth, id)
        self._to_check: list[tuple[int, str]] = []
        self._queued: set[str] = set()
        #: when open spans waiting for a grace period or a timeout are due
        self._wakeups: list[tuple[float, str]] = []
        #: spans closed before the scheduler saw them, waiting for their graph:
        #: id -> when lazy-timeout runs out, in that order (the graph, which comes
        #: in most cases, drops the wait)
        self._awaiting_graph: OrderedDict[str, float] = OrderedDict()
        self._awaiting_until = -math.inf

    def __bool__(self) -> bool:
        """Whether a span is queued for a check."""
        return bool(self._to_check)

    def look_again(self, rec: OpenSpan) -> None:
        """Queue an open span for the next check."""
        if rec.id not in self._queued:
            self._queued.add(rec.id)
            heapq.heappush(self._to_check, (-rec.depth, rec.id))

    def pop(self) -> str:
        """The id of the deepest span queued (taken out of the queue)."""
        _, dask_id = heapq.heappop(self._to_check)
        self._queued.discard(dask_id)
        return dask_id

    def wake_up_at(self, rec: OpenSpan, when: float) -> None:
        """Look at a waiting span again at ``when``, unless an earlier wake-up is
        set (that one looks again and sets the next)."""
        if rec.waits_for_graph:
            awaiting = self._awaiting_graph
            if rec.id in awaiting:
                return
            # (the same wait for all, from the notice's time: in order, unless the
            # grace period grew past lazy-timeout; such a wait goes to the heap)
            if not awaiting or when >= self._awaiting_until:
                awaiting[rec.id] = self._awaiting_until = when
                return
        if rec.wake_at is None or when < rec.wake_at:
            rec.wake_at = when
            heapq.heappush(self._wakeups, (when, rec.id))

    def graph_came(self, dask_id: str) -> None:
        """The span's wait for its graph is over."""
        self._awaiting_graph.pop(dask_id, None)

    def wake_due(self, now: float, records: Mapping[str, OpenSpan]) -> None:
        """Queue the open spans (of ``records``) whose wake-up time has come."""
        wakeups = self._wakeups
        while wakeups and wakeups[0][0] <= now:
            _, dask_id = heapq.heappop(wakeups)
            rec = records.get(dask_id)
            if rec is not None and rec.wake_at is not None and rec.wake_at <= now:
                rec.wake_at = None
                self.look_again(rec)
        awaiting = self._awaiting_graph
        while awaiting and next(iter(awaiting.values())) <= now:
            dask_id, _ = awaiting.popitem(last=False)
            rec = records.get(dask_id)
            if rec is not None:
                self.look_again(rec)

    def pending_wake_ups(self) -> list[float]:
        """The wake-up times set (some for spans handed over since) and the waits for
        graphs."""
        return [when for when, _ in self._wakeups] + list(self._awaiting_graph.values())

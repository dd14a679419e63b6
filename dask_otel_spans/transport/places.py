"""The places in the scheduler's span dict of the dask spans the export processes
handed over, as the export process says them before it hands them over
(:class:`~dask_otel_spans.protocol.wire.HandedOver`): after one died, the next one is
sent again the done spans it had not handed over, and none it had (no span made
twice, none lost but what was on its way out)."""
from __future__ import annotations

import threading
from bisect import bisect_left, bisect_right
from collections.abc import Iterable


def runs(places: Iterable[int]) -> tuple[tuple[int, int], ...]:
    """``places`` as runs of consecutive places ``(first, last)``, in order (the
    spans of a workload are mostly handed over in the order they came: few runs)."""
    out: list[tuple[int, int]] = []
    for place in sorted(set(places)):
        if out and place == out[-1][1] + 1:
            out[-1] = (out[-1][0], place)
        else:
            out.append((place, place))
    return tuple(out)


class Places:
    """A set of places kept as disjoint runs (thread-safe): the reader thread of
    the export process adds, the scheduler's tick asks. Memory: one run per stretch
    of places not handed over yet (spans still running), not one per span."""

    def __init__(self) -> None:
        #: starts and ends (inclusive) of the runs, sorted; no two runs touch
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._lock = threading.Lock()

    def add(self, first: int, last: int) -> None:
        """Add the places ``first`` to ``last`` (inclusive)."""
        if last < first:
            return
        with self._lock:
            starts, ends = self._starts, self._ends
            i = bisect_left(ends, first - 1)  # (the first run that ends at or after)
            j = bisect_right(starts, last + 1)  # (past the last run that starts before)
            if i < j:  # (runs i..j-1 overlap or touch it: one run)
                first, last = min(first, starts[i]), max(last, ends[j - 1])
            starts[i:j] = [first]
            ends[i:j] = [last]

    def add_runs(self, found: Iterable[tuple[int, int]]) -> None:
        for first, last in found:
            self.add(int(first), int(last))

    def __contains__(self, place: object) -> bool:
        if not isinstance(place, int):
            return False
        with self._lock:
            i = bisect_right(self._starts, place) - 1
            return i >= 0 and self._ends[i] >= place

    @property
    def runs(self) -> int:
        """Runs kept."""
        return len(self._starts)

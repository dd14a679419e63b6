"""Heartbeat deltas summed per key between two passes of the export session, so that
each (span, prefix, activity, unit) reaches the span tree and the metrics once per
pass, however many workers' heartbeats named it."""
from __future__ import annotations

from collections.abc import Hashable, Mapping


class DeltaSums:
    """Sums of heartbeat deltas per key, taken (and emptied) once per pass.

    Values that are not numbers are skipped, as the tree and the instruments skip
    them; memory is bounded by the distinct keys of one pass.
    """

    __slots__ = ("_sums", "messages")

    def __init__(self) -> None:
        self._sums: dict[Hashable, float] = {}
        #: messages summed since the last :meth:`take`
        self.messages = 0

    def __bool__(self) -> bool:
        return bool(self._sums)

    def add(self, deltas: Mapping[Hashable, float]) -> None:
        """Add one heartbeat's deltas ``{key: value}``."""
        sums = self._sums
        self.messages += 1
        for key, value in deltas.items():
            if isinstance(value, (int, float)):
                sums[key] = sums.get(key, 0) + value

    def take(self) -> dict[Hashable, float]:
        """The sums since the last call; the sums start again from nothing."""
        sums, self._sums = self._sums, {}
        self.messages = 0
        return sums

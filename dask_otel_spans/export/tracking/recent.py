"""The spans handed over lately: for a while after its hand-over, a span's tags (for
heartbeat deltas that come after it) and its id (against a close notice that comes
after it); then it is forgotten. What the export side keeps follows the spans open
and the recent ones, never every span it saw."""
from __future__ import annotations

from collections import deque

#: Seconds a handed-over span is remembered at least: a busy scheduler delays
#: heartbeats by seconds, so deltas may come after a span's grace period
REMEMBER_SECONDS = 60.0
#: Grace periods a handed-over span is remembered at least (large clusters have
#: long heartbeat intervals)
REMEMBER_GRACE_PERIODS = 3
#: Spans remembered at most, whatever their age (past ~166 spans a second, the
#: oldest go before their time is up)
MAX_REMEMBERED = 10_000


class RecentSpans:
    """Span id -> tags of the spans handed over lately, oldest first: each is
    forgotten :meth:`seconds` after it was handed over, or when more than
    ``max_spans`` came after it.

    Parameters
    ----------
    max_spans:
        Spans remembered at most
    """

    __slots__ = ("_tags", "_order", "max_spans")

    def __init__(self, max_spans: int = MAX_REMEMBERED):
        #: span id -> tags
        self._tags: dict[str, tuple[str, ...]] = {}
        #: (when it is forgotten, span id), in the order handed over
        self._order: deque[tuple[float, str]] = deque()
        self.max_spans = max(1, max_spans)

    @staticmethod
    def seconds(grace: float) -> float:
        """How long a span is remembered, with a grace period of ``grace``."""
        return max(REMEMBER_SECONDS, REMEMBER_GRACE_PERIODS * grace)

    def __contains__(self, span_id: object) -> bool:
        return span_id in self._tags

    def __len__(self) -> int:
        return len(self._tags)

    def tags(self, span_id: str) -> tuple[str, ...]:
        """The tags of a span handed over lately; KeyError for another."""
        return self._tags[span_id]

    def add(self, span_id: str, tags: tuple[str, ...], now: float,
            grace: float) -> None:
        """Remember a span handed over at ``now`` (one remembered already keeps its
        time), forgetting those whose time is up: O(1) per span, amortized."""
        if span_id not in self._tags:
            self._tags[span_id] = tags
            self._order.append((now + self.seconds(grace), span_id))
        self.expire(now)
        order, remembered = self._order, self._tags
        while len(order) > self.max_spans:
            del remembered[order.popleft()[1]]

    def expire(self, now: float) -> None:
        """Forget the spans whose time is up (the oldest first: they are in the
        order they were handed over)."""
        order, remembered = self._order, self._tags
        while order and order[0][0] <= now:
            del remembered[order.popleft()[1]]

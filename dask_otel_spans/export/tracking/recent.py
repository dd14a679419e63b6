"""The spans handed over lately: for a while after its hand-over, a span's tags (for
heartbeat deltas that come after it) and its id (against a close notice that comes
after it); then it is forgotten. What the export side keeps follows the spans open
and the recent ones, never every span it saw."""
from __future__ import annotations

from collections import OrderedDict

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

    __slots__ = ("_spans", "max_spans")

    def __init__(self, max_spans: int = MAX_REMEMBERED):
        #: span id -> (tags, when it is forgotten), in the order handed over
        self._spans: OrderedDict[str, tuple[tuple[str, ...], float]] = OrderedDict()
        self.max_spans = max(1, max_spans)

    @staticmethod
    def seconds(grace: float) -> float:
        """How long a span is remembered, with a grace period of ``grace``."""
        return max(REMEMBER_SECONDS, REMEMBER_GRACE_PERIODS * grace)

    def __contains__(self, span_id: object) -> bool:
        return span_id in self._spans

    def __len__(self) -> int:
        return len(self._spans)

    def tags(self, span_id: str) -> tuple[str, ...]:
        """The tags of a span handed over lately; KeyError for another."""
        return self._spans[span_id][0]

    def add(self, span_id: str, tags: tuple[str, ...], now: float,
            grace: float) -> None:
        """Remember a span handed over at ``now`` (forgetting those whose time is
        up: O(1) per span, amortized)."""
        spans = self._spans
        spans[span_id] = (tags, now + self.seconds(grace))
        spans.move_to_end(span_id)
        self.expire(now)
        while len(spans) > self.max_spans:
            spans.popitem(last=False)

    def expire(self, now: float) -> None:
        """Forget the spans whose time is up (the oldest first: they are in the
        order they were handed over)."""
        spans = self._spans
        while spans:
            span_id, (_, until) = next(iter(spans.items()))
            if until > now:
                return
            del spans[span_id]

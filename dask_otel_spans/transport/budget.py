"""The forward budget: how many messages may wait in the scheduler for the export
process, and what happens past it (the newest dropped and counted, said once when
it starts and once when the export process caught up)."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dask_otel_spans.protocol.events import Message

logger = logging.getLogger(__name__)


class ForwardBudget:
    """Count the messages sent and written; admit a batch while the messages waiting
    stay within ``budget``.

    Parameters
    ----------
    budget:
        Messages that may wait (``otel-spans.forward-budget``)
    why_behind:
        Words on why the export process may be behind, for the warning
    """

    def __init__(self, budget: int, why_behind: str = ""):
        self.budget = max(1, budget)
        self.why_behind = why_behind
        #: messages admitted (the event loop) and written (the sender thread): each
        #: count written by one thread only
        self.sent = self.written = 0
        #: messages dropped past the budget, by kind (``span``, ``deltas``, ...)
        self.dropped_by_kind: dict[str, int] = {}
        self._over = False
        self._dropped_before = 0

    @property
    def waiting(self) -> int:
        """Messages admitted and not yet written (or lost)."""
        return self.sent - self.written

    def admit(self, messages: list[Message]) -> bool:
        """Whether ``messages`` may be queued (counted as sent); False: they were
        dropped and counted."""
        waiting = self.sent - self.written
        if waiting + len(messages) > self.budget:
            self._drop(messages, waiting)
            return False
        if self._over and waiting <= self.budget // 2:
            self._caught_up()
        self.sent += len(messages)
        return True

    def _drop(self, messages: list[Message], waiting: int) -> None:
        dropped = self.dropped_by_kind
        for message in messages:
            kind = message[0] if message else "?"
            dropped[kind] = dropped.get(kind, 0) + 1
        if self._over:
            return
        self._over = True
        self._dropped_before = sum(dropped.values()) - len(messages)
        logger.warning(
            "dask_otel_spans: %d messages wait in the scheduler for the export "
            "process, which is behind (stopped, or starved of CPU%s); dropping new "
            "spans, task groups and metric deltas until it catches up (counted; "
            "otel-spans.forward-budget, now %d, raises the budget)", waiting,
            f": {self.why_behind}" if self.why_behind else "", self.budget,
        )

    def _caught_up(self) -> None:
        self._over = False
        dropped = {k: v for k, v in self.dropped_by_kind.items() if v}
        logger.warning(
            "dask_otel_spans: the export process caught up; %d messages were dropped "
            "while it was behind (so far, by kind: %s; otel-spans.forward-budget "
            "raises the budget)", sum(dropped.values()) - self._dropped_before,
            ", ".join(f"{kind} {n}" for kind, n in sorted(dropped.items())),
        )

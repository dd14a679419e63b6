"""The tasks of one prefix of one dask span that get task spans, merged from the
groups' samples under ``max-task-spans``."""
from __future__ import annotations

import heapq
from collections.abc import Iterable

from dask_otel_spans.protocol.tasks import TaskRecord


class PrefixTasks:
    """The tasks of one prefix of one dask span that get spans: the erred first, then
    the others (the slowest, or the first), ``cap`` in all."""

    __slots__ = ("cap", "slowest", "erred", "others", "seen", "_tie")

    def __init__(self, cap: int, slowest: bool):
        self.cap = cap
        self.slowest = slowest
        self.erred: list[TaskRecord] = []
        self.others: list[tuple[float, int, TaskRecord]] = []
        #: tasks that could have had a span (erred, and finished where kept)
        self.seen = 0
        self._tie = 0

    def add(self, records: Iterable[tuple[object, ...]], erred_seen: int,
            others_seen: int) -> None:
        """Merge a group's records (as the ``tasks`` message carries them)."""
        self.seen += int(erred_seen) + int(others_seen)
        for fields in records:
            record = TaskRecord._make(fields)
            if record.erred:
                if len(self.erred) < self.cap:
                    self.erred.append(record)
                continue
            self._tie += 1
            item = (record.stop - record.start if self.slowest else 0.0,
                    -self._tie if not self.slowest else self._tie, record)
            if len(self.others) < self.cap:
                heapq.heappush(self.others, item)
            elif item[:2] > self.others[0][:2]:
                heapq.heapreplace(self.others, item)

    def chosen(self) -> list[TaskRecord]:
        """The records that get spans: the erred, then the others (slowest first, or
        in the order they came), ``cap`` in all."""
        room = max(0, self.cap - len(self.erred))
        others = sorted(self.others, reverse=True)[:room]
        return self.erred + [r for _, _, r in others]

    @property
    def left_out(self) -> int:
        """Tasks that could have had a span and have none (past the cap)."""
        return max(0, self.seen - len(self.erred) - min(
            len(self.others), max(0, self.cap - len(self.erred))
        ))

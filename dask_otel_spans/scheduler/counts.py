"""The tasks by state of the running task groups, for the export side's live records
(``dask.span.progress``): read from the counts dask keeps (``TaskGroup.states``),
never per task.

The forwarder reads a group's counts when it first forwards the group as running
(:func:`note_counts`: the export side knows its total from then on), then every
running group's at each sweep (:class:`CountsSweep`, every ``live.interval``, 1 s at
most), whatever moved: tasks added, started, settled. Only counts that changed since
they were last sent are sent. So the cost on the event loop does not grow with the
tasks' rate: a few dict reads per group when it starts to run, and per running group
per sweep (benchmarks/README.md, "Live: task counts by state"); a group's counts on the
export side are a sweep old at most.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from distributed.metrics import time

from dask_otel_spans.protocol.dask_facts import state_counts

if TYPE_CHECKING:
    from distributed.scheduler import TaskGroup

#: Seconds between two sweeps at most (``live.interval`` when it is shorter)
COUNTS_INTERVAL = 1.0

#: A group's ``(total, erred, running, waiting)``
Counts = tuple[int, int, int, int]
#: What the ``counts`` message carries of a group:
#: ``(span id, group, total, erred, running, waiting)``
Entry = tuple[str, int, int, int, int, int]


def note_counts(running: dict[TaskGroup, Counts], tg: TaskGroup,
                entries: list[Entry]) -> None:
    """Append the entry of ``tg`` (a running group of a span) to ``entries`` when its
    counts are not those last noted in ``running``, and note them there."""
    counts = state_counts(tg)
    if running.get(tg) != counts:
        running[tg] = counts
        # (a group of a span: its ``span_id`` is set)
        entries.append((tg.span_id, id(tg), *counts))  # type: ignore[arg-type]


class CountsSweep:
    """When every running group's counts are read again, and the reading in steps.

    Parameters
    ----------
    interval:
        Seconds between two sweeps
    clock:
        Seconds (default: distributed's ``time``)
    """

    def __init__(self, interval: float = COUNTS_INTERVAL,
                 clock: Callable[[], float] = time):
        self.interval = max(0.0, interval)
        self._clock = clock
        self._next = 0.0

    def due(self, running: dict[TaskGroup, Counts]) -> bool:
        """Whether a sweep is due: some group runs and the interval has passed (a
        clock read only while groups run)."""
        return bool(running) and self._clock() >= self._next

    def entries(self, running: dict[TaskGroup, Counts], step: int
                ) -> Iterator[list[Entry]]:
        """The entries of the running groups whose counts changed, a list per
        ``step`` groups read (O(running groups)); a group that left ``running``
        between two steps is skipped."""
        self._next = self._clock() + self.interval
        groups = list(running.items())
        step = max(1, step)
        for at in range(0, len(groups), step):
            entries: list[Entry] = []
            for tg, last in groups[at:at + step]:
                counts = state_counts(tg)
                if counts != last and tg in running:
                    running[tg] = counts
                    entries.append((tg.span_id, id(tg), *counts))  # type: ignore[arg-type]
            yield entries

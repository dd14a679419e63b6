"""What the plugin's own code costs the scheduler's event loop: the public statistics
object that benchmarks and operators read (``OTelSpansPlugin.loop_stats``)."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class EventLoopStats:
    """Wall and CPU time of the plugin's calls on the event loop, by place.

    The ``transition`` hook and the hooks that only queue an event are not timed:
    the clock reads would cost more than their work.

    Attributes
    ----------
    total_seconds, total_cpu_seconds:
        Sums over every timed call
    max_seconds, max_cpu_seconds:
        The longest call, in wall time and in CPU time of the event-loop thread
    max_seconds_by_place:
        The longest call of each place (``tick``, ``heartbeat``, ``close``, ...)
    pause_clock:
        Cumulative seconds the thread spent paused (e.g. in garbage collection),
        when a benchmark provides it: ``max_cpu_less_pauses_seconds`` is then the
        longest call's CPU without them
    """

    def __init__(self) -> None:
        self.total_seconds = 0.0
        self.total_cpu_seconds = 0.0
        self.max_seconds = 0.0
        self.max_cpu_seconds = 0.0
        self.max_seconds_by_place: dict[str, float] = {}
        self.pause_clock: Callable[[], float] | None = None
        self.max_cpu_less_pauses_seconds = 0.0
        self.max_cpu_less_pauses_by_place: dict[str, float] = {}

    @contextmanager
    def timed(self, place: str) -> Iterator[None]:
        """Account the block's time to ``place``."""
        pause_clock = self.pause_clock
        paused0 = pause_clock() if pause_clock is not None else 0.0
        t0 = time.perf_counter()
        cpu0 = time.thread_time()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - t0
            cpu = time.thread_time() - cpu0
            self.total_seconds += elapsed
            self.total_cpu_seconds += cpu
            self.max_seconds = max(self.max_seconds, elapsed)
            by_place = self.max_seconds_by_place
            if elapsed > by_place.get(place, 0.0):
                by_place[place] = elapsed
            self.max_cpu_seconds = max(self.max_cpu_seconds, cpu)
            if pause_clock is not None:
                own = max(0.0, cpu - (pause_clock() - paused0))
                self.max_cpu_less_pauses_seconds = max(
                    self.max_cpu_less_pauses_seconds, own
                )
                by_place = self.max_cpu_less_pauses_by_place
                if own > by_place.get(place, 0.0):
                    by_place[place] = own

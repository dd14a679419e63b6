"""The machine's speed while a benchmark runs: the CPU time of a fixed piece of Python
work, timed every so often on a thread of the benchmark's own process.

On a shared machine the same code takes more CPU time when the host is busier (other
tenants of its cores and caches): a run of the plugin and a run of the baseline a minute
apart can differ by 15 % in CPU per task for that reason alone. The probe was meant to
tell such a drift from the plugin's cost; in run AK (README) its readings did not follow
the cluster's drift, and the benchmark divides by the workers' CPU instead. It is still
reported, as a second opinion.
"""
from __future__ import annotations

import statistics
import threading
import time


def fixed_work(rounds: int) -> int:
    """Pure-Python work of a fixed size (dict and list operations, as a scheduler's)."""
    seen: dict[int, int] = {}
    out = []
    for i in range(rounds):
        seen[i % 97] = seen.get(i % 97, 0) + i
        out.append(i * 3 % 7)
    return len(out) + len(seen)


class SpeedProbe:
    """Times :func:`fixed_work` on a daemon thread every ``interval`` seconds.

    Parameters
    ----------
    rounds
        Size of the work: 2,000 rounds take about 0.3 ms on this 2-core machine, so
        the probe costs about 0.15 % of a core at the default interval.
    interval
        Seconds between two timings.

    The reading is the thread's CPU time (``time.thread_time``), not wall time: time
    spent waiting for the GIL or for a core does not count, a slower core does.
    """

    def __init__(self, rounds: int = 2_000, interval: float = 0.2):
        self.rounds = rounds
        self.interval = interval
        self.readings: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="speed-probe", daemon=True)

    def __enter__(self) -> SpeedProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            start = time.thread_time()
            fixed_work(self.rounds)
            self.readings.append(time.thread_time() - start)

    def mark(self) -> int:
        """A position in the readings, for :meth:`median_since`."""
        return len(self.readings)

    def median_since(self, mark: int) -> float:
        """Median CPU seconds of one piece of work since ``mark`` (NaN if none)."""
        readings = self.readings[mark:]
        return statistics.median(readings) if readings else float("nan")

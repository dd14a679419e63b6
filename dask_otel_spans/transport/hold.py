"""When the scheduler's export work waits: while the scheduler's event loop is busy,
the child sender holds its writes (and so the export process its work), for at most
half the grace period, so that no span's emission moves. Pure bookkeeping on two
clocks; the sender asks."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

#: The event loop is busy when its thread ran at least this share of the last window
BUSY_SHARE = 0.5
#: Seconds over which the event loop's share is measured, and between two looks
WINDOW = 0.05


class BusyLoopHold:
    """Whether export work waits for a busy event loop.

    Export work running beside a busy scheduler slows it by more than the work's own
    CPU (the sender thread's GIL hand-overs with the loop; the export process on
    another CPU shares caches and memory bandwidth), and spans are emitted a grace
    period after they are done anyway. So while the event-loop thread runs at least
    ``share`` of the time (measured over ``window`` seconds on its CPU clock, read
    from the asking thread: nothing runs on the loop), :meth:`holding` says to wait,
    for at most ``longest`` seconds at a stretch; after that the work goes out and a
    new stretch may begin. A scheduler busy for longer than ``longest`` gets the
    export work in bursts, not less of it.

    Parameters
    ----------
    loop_cpu:
        The event-loop thread's CPU seconds (a clock); None: never hold
    longest:
        Seconds a stretch of holding lasts at most; 0 or less: never hold
    share:
        The share of a window the loop must run to be busy
    window:
        Seconds between two looks at the loop's clock
    clock:
        Wall-clock seconds (monotonic)
    """

    def __init__(
        self,
        loop_cpu: Callable[[], float] | None,
        longest: float,
        *,
        share: float = BUSY_SHARE,
        window: float = WINDOW,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.longest = longest
        self.share = share
        self.window = window
        self._loop_cpu = loop_cpu if longest > 0 else None
        self._clock = clock
        self._looked_at = clock()
        self._loop_cpu_then = self._read_loop_cpu()
        self._busy = False
        #: when the current stretch of holding began; None: not holding
        self._since: float | None = None
        #: stretches of holding that began, and seconds held in all (figures)
        self.stretches = 0
        self.held_seconds = 0.0

    @classmethod
    def of_thread(cls, thread_id: int, longest: float) -> BusyLoopHold:
        """A hold on the thread ``thread_id`` (``threading.get_ident()`` of the event
        loop's thread); one that never holds where its CPU clock cannot be read."""
        try:
            clock_id = time.pthread_getcpuclockid(thread_id)
            time.clock_gettime(clock_id)
        except (AttributeError, OSError) as e:  # (not POSIX, or no such clock)
            logger.debug("dask_otel_spans: the event loop's CPU clock cannot be read "
                         "(%s); export work does not wait for a busy loop", e)
            return cls(None, longest)
        return cls(lambda: time.clock_gettime(clock_id), longest)

    def _read_loop_cpu(self) -> float:
        if self._loop_cpu is None:
            return 0.0
        try:
            return self._loop_cpu()
        except OSError:  # (the thread is gone)
            self._loop_cpu = None
            return 0.0

    def holding(self) -> bool:
        """Whether the work should wait now: the loop is busy and the current
        stretch of holding is shorter than ``longest``."""
        if self._loop_cpu is None:
            return False
        now = self._clock()
        elapsed = now - self._looked_at
        if elapsed >= self.window:
            cpu = self._read_loop_cpu()
            self._busy = cpu - self._loop_cpu_then >= self.share * elapsed
            self._looked_at, self._loop_cpu_then = now, cpu
        if not self._busy:
            self.released(now)
            return False
        if self._since is None:
            self._since = now
            self.stretches += 1
            return True
        return now - self._since < self.longest

    def released(self, now: float | None = None) -> None:
        """The work went out: a stretch of holding, if one ran, ends."""
        if self._since is not None:
            self.held_seconds += (self._clock() if now is None else now) - self._since
            self._since = None

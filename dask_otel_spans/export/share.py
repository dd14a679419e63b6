"""How much of the scheduler process's CPU exporting in that process takes: watched
in windows, so that the plugin can say once when the export process would help."""
from __future__ import annotations

import time
from collections.abc import Callable

#: Seconds of one window
WINDOW_S = 60.0
#: Share of the process's CPU taken by export threads that is worth a word: the
#: scheduler should not notice the plugin, and this is what it notices
SHARE_THRESHOLD = 0.05
#: The process must have been this busy (CPU seconds per second of the window) for
#: the share to matter: an idle scheduler's small CPU makes any share look large
BUSY_THRESHOLD = 0.25


class ExportShareWatch:
    """Compares the CPU seconds of the export threads with the process's, one window
    at a time, and reports the first busy window whose share reaches the threshold.

    Parameters
    ----------
    export_cpu:
        Cumulative CPU seconds of the export threads (ender and metrics)
    process_cpu:
        Cumulative CPU seconds of the whole process
    clock:
        Monotonic seconds
    window, share_threshold, busy_threshold:
        See the module constants

    Notes
    -----
    :meth:`check` is O(1) and meant for the plugin's tick: one clock read per call,
    three more once per window.
    """

    def __init__(
        self,
        export_cpu: Callable[[], float],
        *,
        process_cpu: Callable[[], float] = time.process_time,
        clock: Callable[[], float] = time.monotonic,
        window: float = WINDOW_S,
        share_threshold: float = SHARE_THRESHOLD,
        busy_threshold: float = BUSY_THRESHOLD,
    ):
        self._export_cpu = export_cpu
        self._process_cpu = process_cpu
        self._clock = clock
        self.window = window
        self.share_threshold = share_threshold
        self.busy_threshold = busy_threshold
        self.reported = False
        self._start: tuple[float, float, float] | None = None

    def check(self) -> tuple[float, float] | None:
        """``(share, window seconds)`` the first time a window ends busy with a share
        at or above the threshold; None otherwise, and always after that."""
        if self.reported:
            return None
        now = self._clock()
        start = self._start
        if start is None:
            self._start = (now, self._export_cpu(), self._process_cpu())
            return None
        started, export0, process0 = start
        elapsed = now - started
        if elapsed < self.window:
            return None
        export_cpu, process_cpu = self._export_cpu(), self._process_cpu()
        self._start = (now, export_cpu, process_cpu)
        used = process_cpu - process0
        if elapsed <= 0 or used < self.busy_threshold * elapsed:
            return None
        share = (export_cpu - export0) / used
        if share < self.share_threshold:
            return None
        self.reported = True
        return share, elapsed

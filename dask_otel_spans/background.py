"""A daemon thread that runs queued work in order, off the scheduler's event loop."""
from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

logger = logging.getLogger(__name__)

_STOP = object()


class _Batch(list):
    """Items queued in one queue operation, handled one by one, in order."""


class BackgroundQueue:
    """Run ``handle(item)`` for every submitted item, in order, on a daemon thread.

    ``submit`` never blocks the caller: with a ``maxsize`` and a full queue the item
    is dropped, counted in ``dropped`` and logged once. ``maxsize=0`` never drops.
    A failure of one item is logged once per exception type and never stops the
    thread.

    Parameters
    ----------
    name:
        Thread name
    maxsize:
        Largest number of pending items; 0 for no limit
    what:
        What the items are, for the log lines
    """

    def __init__(self, name: str, maxsize: int = 0, what: str = "items"):
        self.name = name
        self.what = what
        self._queue: queue.Queue = queue.Queue(maxsize=max(0, maxsize))
        self._thread: threading.Thread | None = None
        self.dropped = 0
        #: CPU seconds the thread spent handling items (figures for benchmarks)
        self.cpu_seconds = 0.0
        self._failures_logged: set[str] = set()

    @property
    def running(self) -> bool:
        """Whether the thread runs (started and not stopped)."""
        return self._thread is not None

    def handle(self, item: Any) -> None:
        raise NotImplementedError

    def settle(self) -> None:
        """Finish work that ``handle`` held back: called on the thread when
        :meth:`next_settle_in` runs out with no item, and before a flush or a stop
        completes."""

    def next_settle_in(self) -> float | None:
        """Seconds the thread may wait for an item before :meth:`settle` is due;
        None waits for the next item."""
        return None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=self.name, daemon=True
            )
            self._thread.start()

    def put(self, item: Any) -> bool:
        """Queue ``item``; False (and counted) when the queue is full."""
        try:
            self._queue.put_nowait(item)
            return True
        except queue.Full:
            self._count_dropped(1)
            return False

    def put_many(self, items: list[Any]) -> bool:
        """Queue ``items`` in one queue operation (one wake-up of the thread instead
        of one per item); they take one place of ``maxsize``. False (and every item
        counted) when the queue is full."""
        if not items:
            return True
        try:
            self._queue.put_nowait(_Batch(items))
            return True
        except queue.Full:
            self._count_dropped(len(items))
            return False

    def _count_dropped(self, n: int, why: str | None = None, *args: Any) -> None:
        """Count ``n`` dropped items; the first drop is logged (``why``, or the
        queue being full)."""
        first = self.dropped == 0
        self.dropped += n
        if not first:
            return
        if why is None:
            why = ("dask_otel_spans: %s queue full (%d pending); dropping %s "
                   "(counted in %s.dropped)")
            args = (self.name, self._queue.maxsize, self.what, type(self).__name__)
        logger.warning(why, *args)

    def _run(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=self.next_settle_in())
            except queue.Empty:
                cpu0 = time.thread_time()
                self._safely(self.settle)
                self.cpu_seconds += time.thread_time() - cpu0
                continue
            cpu0 = time.thread_time()
            try:
                if item is _STOP:
                    self._safely(self.settle)
                    return
                if isinstance(item, threading.Event):
                    self._safely(self.settle)
                    item.set()
                    continue
                if type(item) is _Batch:
                    for one in item:
                        self._safely(self.handle, one)
                else:
                    self._safely(self.handle, item)
            finally:
                self.cpu_seconds += time.thread_time() - cpu0
                self._queue.task_done()

    def _safely(self, method: Any, *args: Any) -> None:
        """Run one piece of work; a failure is logged once per exception type."""
        try:
            method(*args)
        except Exception as e:
            kind = type(e).__name__
            if kind not in self._failures_logged:
                self._failures_logged.add(kind)
                logger.exception(
                    "dask_otel_spans: %s failed on one of its %s (logged once "
                    "per error type)", self.name, self.what,
                )

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every item submitted so far was handled; False on timeout."""
        if self._thread is None:
            return True
        marker = threading.Event()
        try:
            self._queue.put(marker, timeout=timeout)
        except queue.Full:
            return False
        return marker.wait(timeout)

    def stop(self, timeout: float = 10) -> None:
        """Handle what is queued, then end the thread."""
        if self._thread is None:
            return
        while True:
            try:
                self._queue.put(_STOP, timeout=timeout)
                break
            except queue.Full:  # pragma: no cover
                continue
        self._thread.join(timeout)
        self._thread = None

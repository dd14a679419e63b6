"""The engine of the package's threads: a daemon thread that runs queued work in
order, off the scheduler's event loop. The session, the ender, the metrics pump and
the child sender each compose one (:class:`QueueThread`) and give it their
handlers."""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

logger = logging.getLogger(__name__)

_STOP = object()

#: What a :class:`QueueThread` handles
_T = TypeVar("_T")


class _Batch(list):
    """Items queued in one queue operation, handled one by one, in order."""


class QueueThread(Generic[_T]):
    """Run ``handle(item)`` for every queued item, in order, on a daemon thread.

    :meth:`put` never blocks the caller: with a ``maxsize`` and a full queue the item
    is dropped, counted in :attr:`dropped` and logged once. ``maxsize=0`` never
    drops. A failure of one item is logged once per exception type and never stops
    the thread.

    Parameters
    ----------
    name:
        Thread name
    handle:
        Called on the thread with each item
    maxsize:
        Largest number of pending items; 0 for no limit
    what:
        What the items are, for the log lines
    due:
        Work that ``handle`` held back (a batch to write, sums to send): called on
        the thread when ``due_in`` runs out with no item, and before a flush or a
        stop completes
    due_in:
        Seconds the thread may wait for an item before ``due`` is called; None
        waits for the next item
    counted_in:
        Where drops are counted, for the log line (e.g. ``"MetricsPump.dropped"``)
    """

    def __init__(
        self,
        name: str,
        handle: Callable[[_T], None],
        *,
        maxsize: int = 0,
        what: str = "items",
        due: Callable[[], None] | None = None,
        due_in: Callable[[], float | None] | None = None,
        counted_in: str = "dropped",
    ):
        self.name = name
        self.what = what
        self._handle = handle
        self._due = due
        self._due_in = due_in
        self._counted_in = counted_in
        self._queue: queue.Queue[object] = queue.Queue(maxsize=max(0, maxsize))
        self._thread: threading.Thread | None = None
        #: items dropped because the queue was full
        self.dropped = 0
        #: CPU seconds the thread spent on its work (figures for benchmarks)
        self.cpu_seconds = 0.0
        self._failures_logged: set[str] = set()

    @property
    def running(self) -> bool:
        """Whether the thread runs (started and not stopped)."""
        return self._thread is not None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=self.name, daemon=True
            )
            self._thread.start()

    def put(self, item: _T) -> bool:
        """Queue ``item``; False (and counted) when the queue is full."""
        try:
            self._queue.put_nowait(item)
            return True
        except queue.Full:
            self._count_dropped(1)
            return False

    def put_many(self, items: list[_T]) -> bool:
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

    def put_waiting(self, item: _T, timeout: float | None) -> bool:
        """Queue ``item``, waiting at most ``timeout`` seconds for room (an item that
        must not be dropped, such as a flush request); False when there was none."""
        return self._put_waiting(item, timeout)

    def _put_waiting(self, item: object, timeout: float | None) -> bool:
        """:meth:`put_waiting` of any item: the thread's own (a flush marker, the
        stop) too."""
        try:
            self._queue.put(item, timeout=timeout)
            return True
        except queue.Full:
            return False

    def _count_dropped(self, n: int) -> None:
        first = self.dropped == 0
        self.dropped += n
        if first:
            logger.warning(
                "dask_otel_spans: %s queue full (%d pending); dropping %s (counted in "
                "%s)", self.name, self._queue.maxsize, self.what, self._counted_in,
            )

    def _run(self) -> None:
        while True:
            try:
                item = self._queue.get(
                    timeout=self._due_in() if self._due_in is not None else None
                )
            except queue.Empty:
                cpu0 = time.thread_time()
                self._run_due()
                self.cpu_seconds += time.thread_time() - cpu0
                continue
            cpu0 = time.thread_time()
            try:
                if item is _STOP:
                    self._run_due()
                    return
                if isinstance(item, threading.Event):
                    self._run_due()
                    item.set()
                    continue
                if type(item) is _Batch:
                    for one in item:
                        self._safely(self._handle, one)
                else:
                    self._safely(self._handle, item)
            finally:
                self.cpu_seconds += time.thread_time() - cpu0
                self._queue.task_done()

    def _run_due(self) -> None:
        if self._due is not None:
            self._safely(self._due)

    def _safely(self, method: Callable[..., None], *args: object) -> None:
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
        """Wait until every item queued so far was handled and the due work done;
        False on timeout."""
        if self._thread is None:
            return True
        marker = threading.Event()
        if not self._put_waiting(marker, timeout):
            return False
        return marker.wait(timeout)

    def stop(self, timeout: float = 10) -> None:
        """Handle what is queued, then end the thread."""
        if self._thread is None:
            return
        while not self._put_waiting(_STOP, timeout):  # pragma: no cover
            pass
        self._thread.join(timeout)
        self._thread = None


class ThreadWorker:
    """A component whose work runs on one :class:`QueueThread` (``self.thread``, made
    by the subclass): starting, flushing and stopping it, and its figures."""

    thread: QueueThread

    @property
    def dropped(self) -> int:
        """Items dropped because the queue was full."""
        return self.thread.dropped

    @property
    def cpu_seconds(self) -> float:
        """CPU seconds the thread spent on the work."""
        return self.thread.cpu_seconds

    def start(self) -> None:
        self.thread.start()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything put so far was handled; False after ``timeout``."""
        return self.thread.flush(timeout)

    def stop(self, timeout: float = 10) -> None:
        """Handle what is queued, then end the thread (at most ``timeout`` seconds)."""
        self.thread.stop(timeout)

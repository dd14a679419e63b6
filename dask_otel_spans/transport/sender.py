"""The scheduler's side of the pipe to the export process: what the plugin sends is
queued (never blocking the event loop), encoded in batches on a sender thread and
written to the child's stdin. The child itself is the
:class:`~dask_otel_spans.transport.supervisor.ChildSupervisor`'s."""
from __future__ import annotations

import logging
import subprocess
import time

from dask_otel_spans.background import QueueThread
from dask_otel_spans.protocol import events
from dask_otel_spans.protocol.events import Message
from dask_otel_spans.protocol.figures import ExportFigures, SenderFigures
from dask_otel_spans.protocol.wire import encode_batch, flush_message, is_flush, read_flush
from dask_otel_spans.transport.budget import ForwardBudget
from dask_otel_spans.transport.supervisor import ChildSupervisor

logger = logging.getLogger(__name__)

#: Items per frame at most; a frame also goes out whenever the queue runs empty
_BATCH_SIZE = 256


class ChildSender:
    """Send the forwarder's messages to the export process, which runs the
    :class:`~dask_otel_spans.export.session.ExportSession` on them
    (:mod:`~dask_otel_spans.transport.child`).

    :meth:`send` queues (never blocks); the sender thread encodes batches
    (:func:`~dask_otel_spans.protocol.wire.encode_batch`) and writes them to the
    child's stdin, with the entries of the scheduler's ``total_nthreads_history``
    the child has not had yet. A child that died is replaced by the supervisor when
    the next batch is written.

    Parameters
    ----------
    supervisor:
        The export process's supervisor, its first child launched
    budget:
        Messages that may wait in this process for the export process
        (``forward-budget``; :class:`~dask_otel_spans.transport.budget.ForwardBudget`)
    """

    def __init__(self, supervisor: ChildSupervisor, *, budget: int = 100_000):
        self.supervisor = supervisor
        #: what may wait for the child (:meth:`send`)
        self.budget = ForwardBudget(
            budget, f"it runs at nice {supervisor.nice}, CPU policy "
            f"{supervisor.cpu_policy}",
        )
        #: items that could not reach a live export process
        self.lost = 0
        #: frames written to the export process (one write and flush each)
        self.frames = 0
        #: the scheduler's ``total_nthreads_history``, which the child keeps a copy
        #: of; None: no copy
        self.nthreads_history: list[tuple[float, int]] | None = None
        self.thread = QueueThread(
            "dask-otel-spans-export-sender", self._take, what="forwarded messages",
            due=self._write_batch, due_in=self._write_in,
        )
        self._batch: list[Message] = []
        self._unpicklable_logged = False
        #: entries of ``nthreads_history`` the running child has, and which child
        self._history_sent = 0
        self._history_launch = supervisor.launches

    # -- what the transport calls --------------------------------------------------------

    def start(self) -> None:
        self.thread.start()

    def send(self, messages: list[Message]) -> None:
        """Queue messages of the protocol (:mod:`~dask_otel_spans.protocol.events`)
        for the export process, in order; never blocks. Past the budget they are
        dropped and counted (:class:`~dask_otel_spans.transport.budget.ForwardBudget`)."""
        if messages and self.budget.admit(messages):
            self.thread.put(messages)

    @property
    def waiting(self) -> int:
        """Messages sent and not yet written to the export process (or lost)."""
        return self.budget.waiting

    def figures(self) -> ExportFigures:
        """The export process's figures as last reported (its counts with those of
        the children that died), and what this side lost or dropped."""
        return self.supervisor.figures().replace(sender=SenderFigures(
            lost=self.lost, frames=self.frames, waiting=self.waiting,
            dropped_by_kind=dict(self.budget.dropped_by_kind)))

    def flush(self, timeout: float | None = None, exporters: bool = True) -> bool:
        """Wait until the export process applied everything queued so far and
        handed over what is ready, and (``exporters``) exported it; False when it
        did not answer within ``timeout`` seconds (or is gone)."""
        if not self.thread.running:
            return True
        timeout = 10.0 if timeout is None else timeout
        deadline = time.monotonic() + timeout
        flush = self.supervisor.expect_flush()
        if not self.thread.put_waiting(flush_message(flush.token, timeout, exporters),
                                       timeout):
            self.supervisor.end_flush(flush.token)
            return False
        flush.done.wait(max(0.0, deadline - time.monotonic()))
        self.supervisor.end_flush(flush.token)
        return flush.ok

    def stop(self, timeout: float = 10) -> None:
        """Send what is queued, then let the export process finish its exports and
        exit (killed after ``timeout`` seconds)."""
        self.thread.stop(timeout)
        self.supervisor.stop(timeout)

    # -- the sender thread ---------------------------------------------------------------

    def _take(self, item: list[Message] | Message) -> None:
        # (a batch that :meth:`send` queued, or a flush message: a tuple)
        if isinstance(item, list):
            self._batch.extend(item)
        else:  # (a flush message): everything before it goes out first
            self._batch.append(item)
            self._write_batch()
            return
        if len(self._batch) >= _BATCH_SIZE:
            self._write_batch()

    def _write_in(self) -> float | None:
        return 0.0 if self._batch else None

    def _write_batch(self) -> None:
        """Write the batch to the export process."""
        batch, self._batch = self._batch, []
        if not batch:
            return
        try:
            self._write(batch)
        finally:
            self.budget.written += sum(1 for item in batch if not is_flush(item))

    def _encode(self, batch: list[Message]) -> bytes:
        """The batch as one frame; an item that cannot be pickled (e.g. odd objects
        in span code) is left out, counted in ``lost`` and logged once."""
        try:
            return encode_batch(batch)
        except Exception:
            pass
        kept = []
        for item in batch:
            try:
                encode_batch([item])
            except Exception as e:
                self.lost += 1
                if not self._unpicklable_logged:
                    self._unpicklable_logged = True
                    logger.error(
                        "dask_otel_spans: cannot send an item (%s) to the export process "
                        "(%s: %s); left out (logged once, counted in "
                        "ChildSender.lost)", item[0], type(e).__name__, e,
                    )
                continue
            kept.append(item)
        return encode_batch(kept)

    def _new_history(self) -> tuple[list[Message], int]:
        """The ``history`` message with the entries of ``nthreads_history`` the
        running child has not had yet (none when it has them all), and the length
        it will then have. O(new entries), not O(history)."""
        if self._history_launch != self.supervisor.launches:  # a new child: none
            self._history_launch = self.supervisor.launches
            self._history_sent = 0
        history, sent = self.nthreads_history, self._history_sent
        if history is None:
            return [], sent
        n = len(history)
        if n <= sent:
            return [], sent
        return [events.nthreads_history(sent, history[sent:n])], n

    def _write(self, batch: list[Message]) -> None:
        for _ in range(2):  # the running child, or else a new one
            proc = self.supervisor.live_child()
            if proc is None:
                break
            history_message, history_len = self._new_history()
            frame = self._encode(history_message + batch)
            stdin = proc.stdin
            assert stdin is not None  # (started with stdin=PIPE)
            try:
                stdin.write(frame)
                stdin.flush()
                self.frames += 1
                self._history_sent = history_len
                return
            except (OSError, ValueError):
                try:
                    proc.wait(1.0)
                except subprocess.TimeoutExpired:
                    proc.kill()
        self.lost += sum(1 for item in batch if not is_flush(item))
        for item in batch:
            if is_flush(item):
                self.supervisor.end_flush(read_flush(item).token)

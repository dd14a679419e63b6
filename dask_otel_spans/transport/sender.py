"""``ExportProcess``: the scheduler's side of the export process. It copies what the
plugin queues onto a pipe to a child process that translates and exports it, so that
the OTel SDK's work does not share the scheduler's GIL with its event loop."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from itertools import count
from typing import Any

from dask_otel_spans.background import BackgroundQueue
from dask_otel_spans.protocol.wire import encode_batch, read_frame, write_frame
from dask_otel_spans.transport.budget import ForwardBudget
from dask_otel_spans.transport.spec import PipelineSpec

logger = logging.getLogger(__name__)

#: Items per frame at most; a frame also goes out whenever the queue runs empty
_BATCH_SIZE = 256
#: Nice levels the export process runs below the scheduler: where they share a core,
#: the scheduler's event loop goes first
EXPORT_PROCESS_NICE = 10
#: Counts of a child's figures that go on over a restart (:meth:`child_total`)
_CUMULATIVE = ("handed_over", "received")


class ExportProcessError(RuntimeError):
    """The export process could not be started.

    ``setup_failed``: it started but could not set up its exporters (the scheduler
    process could not either); otherwise it did not start or answer."""

    def __init__(self, reason: str, setup_failed: bool = False):
        super().__init__(reason)
        self.setup_failed = setup_failed


class _Flush:
    """A flush waiting for the export process's answer."""

    __slots__ = ("done", "ok")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.ok = False


class ExportProcess(BackgroundQueue):
    """The transport to the export process: the forwarder's messages go over a
    pipe to a child process, which runs the
    :class:`~dask_otel_spans.export.session.ExportSession` on them
    (:mod:`~dask_otel_spans.transport.child`).

    :meth:`send` queues (never blocks); a sender thread encodes batches
    (:func:`~dask_otel_spans.protocol.wire.encode_batch`) and writes them to the child's
    stdin, with the entries of the scheduler's ``total_nthreads_history`` the child
    has not had yet.

    When the child dies, this is logged and a new one is started, at most
    ``max_restarts`` times; what the dead one held (spans not yet exported, metric
    sums since its last export) is lost, and its counters start again from zero
    (cumulative consumers see a reset). ``launches`` counts the children: the
    plugin forwards the running spans again to a new one, from
    ``confirmed_position`` on.

    Parameters
    ----------
    spec:
        How the child builds its providers
    start_timeout:
        Seconds to wait for a child to report ready
    max_restarts:
        Children started after the first one died
    budget:
        Messages that may wait in this process for the export process
        (``forward-budget``; :class:`~dask_otel_spans.transport.budget.ForwardBudget`)
    nice:
        Nice levels the child runs below this process: 0 for the same priority
    cpu_policy:
        How the child's threads are scheduled (Linux): ``"idle"``, ``"batch"`` or
        ``"normal"`` (:data:`~dask_otel_spans.config.CPU_POLICIES`); ``"normal"``
        leaves them as this process's
    """

    def __init__(
        self,
        spec: PipelineSpec,
        *,
        start_timeout: float = 60.0,
        max_restarts: int = 3,
        budget: int = 100_000,
        nice: int = 0,
        cpu_policy: str = "normal",
    ):
        super().__init__(
            "dask-otel-spans-export-sender", 0, "forwarded messages"
        )
        self.spec = spec
        self.start_timeout = start_timeout
        self.max_restarts = max_restarts
        self.nice = max(0, int(nice))
        self.cpu_policy = cpu_policy
        #: what may wait for the child (:meth:`send`)
        self.budget = ForwardBudget(
            budget, f"it runs at nice {self.nice}, CPU policy {cpu_policy}"
        )
        self.restarts = 0
        #: children started so far (a new one knows nothing of the spans forwarded
        #: to the one before)
        self.launches = 0
        #: items that could not reach a live export process
        self.lost = 0
        #: the child's figures (:meth:`ExportPipeline.stats`), as last reported
        self.child_stats: dict[str, Any] = {}
        #: what the child said when it was ready: where traces and metrics go, pid
        self.info: dict[str, Any] = {}
        self._proc: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None
        self._batch: list[tuple[Any, ...]] = []
        self._flushes: dict[int, _Flush] = {}
        self._tokens = count(1)
        self._stopping = False
        self._gave_up = False
        #: pids of children whose end was logged
        self._deaths_logged: set[int] = set()
        self._unpicklable_logged = False
        #: the child whose figures ``child_stats`` holds
        self._stats_pid: int | None = None
        #: spans exported by children that died
        self._exported_by_dead = 0
        #: counts of the children that died, of the figures :meth:`child_total` reads
        self._counts_of_dead: dict[str, int] = {}
        #: the highest place in the scheduler's span dict that an export process
        #: said it had (``last_position``) before it died; -1: none
        self.confirmed_position = -1
        #: the scheduler's ``total_nthreads_history``, which the child keeps a copy
        #: of; None: no copy
        self.nthreads_history: list[tuple[float, int]] | None = None
        #: its entries the running child has
        self._history_sent = 0

    # -- the child -----------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def child_running(self) -> bool:
        """Whether the export process runs (False once it ended and was reaped)."""
        proc = self._proc
        return proc is not None and proc.poll() is None

    @property
    def exported_count(self) -> int:
        """Spans the export processes handed to their tracer provider (as last
        reported; a replaced child's count is kept)."""
        return self._exported_by_dead + int(self.child_stats.get("exported", 0))

    def child_total(self, name: str) -> int:
        """A count of the export processes' copies of the span tree (``handed_over``:
        spans handed to their exporters; ``received``: spans forwarded to them), as
        last reported, with those of children that died."""
        return self._counts_of_dead.get(name, 0) + int(self.child_stats.get(name, 0))

    def launch(self) -> dict[str, Any]:
        """Start a child and wait until it is ready; its ``info``."""
        env = dict(os.environ)
        # the child imports what this process imports (e.g. a providers factory)
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in sys.path if p))
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "dask_otel_spans.transport.child",
                 "--nice", str(self.nice), "--cpu-policy", self.cpu_policy],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
            )
        except (OSError, ValueError) as e:
            raise ExportProcessError(f"cannot start {sys.executable}: {e}") from e
        ready = threading.Event()
        answer: dict[str, Any] = {}
        reader = threading.Thread(
            target=self._read, args=(proc, ready, answer),
            name="dask-otel-spans-export-reader", daemon=True,
        )
        reader.start()
        try:
            write_frame(proc.stdin, self.spec)
        except (OSError, ValueError):
            pass  # the reader sees the child end
        if not ready.wait(self.start_timeout) or "ready" not in answer:
            reason = answer.get("failed") or (
                f"no answer within {self.start_timeout}s"
                if proc.poll() is None
                else f"exit code {proc.poll()}"
            )
            self._end(proc, reader, timeout=1.0)
            raise ExportProcessError(reason, setup_failed="failed" in answer)
        self._proc, self._reader = proc, reader
        self.launches += 1
        self._history_sent = 0  # a new child has none of it
        self._exported_by_dead += int(self.child_stats.get("exported", 0))
        for name in _CUMULATIVE:
            self._counts_of_dead[name] = (
                self._counts_of_dead.get(name, 0) + int(self.child_stats.get(name, 0))
            )
        self.confirmed_position = max(
            self.confirmed_position, int(self.child_stats.get("last_position", -1))
        )
        self.child_stats = {}
        self._stats_pid = proc.pid
        self.info = answer["ready"]
        return self.info

    def _read(self, proc: subprocess.Popen, ready: threading.Event,
              answer: dict[str, Any]) -> None:
        """Reader thread of one child: its answers, until its stdout ends."""
        try:
            while True:
                message = read_frame(proc.stdout)
                kind = message[0]
                if kind in ("ready", "failed"):
                    answer[kind] = message[1]
                    ready.set()
                elif kind == "stats" or kind == "stopped":
                    if proc.pid == self._stats_pid:
                        self.child_stats = message[1]
                elif kind == "flushed":
                    _, token, ok, stats = message
                    if proc.pid == self._stats_pid:
                        self.child_stats = stats
                    flush = self._flushes.pop(token, None)
                    if flush is not None:
                        flush.ok = bool(ok)
                        flush.done.set()
        except EOFError:
            pass
        except Exception:
            logger.exception("dask_otel_spans: unreadable answer from the export process")
        finally:
            ready.set()
            if proc is self._proc and not self._stopping:
                self._log_death(proc)
            if proc is self._proc:
                self._fail_flushes()

    def _log_death(self, proc: subprocess.Popen) -> None:
        """Log, once per child, that it ended while the scheduler needed it."""
        if proc.pid in self._deaths_logged:
            return
        self._deaths_logged.add(proc.pid)
        logger.error(
            "dask_otel_spans: the export process (pid %d) exited with code %s; spans "
            "and metric sums it had not exported yet are lost", proc.pid, proc.wait(),
        )

    def _fail_flushes(self) -> None:
        for token in list(self._flushes):
            flush = self._flushes.pop(token, None)
            if flush is not None:
                flush.done.set()

    def _live_child(self) -> subprocess.Popen | None:
        """The running child; a new one when it died (at most ``max_restarts``)."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            return proc
        if self._stopping or self._gave_up:
            return None
        if proc is not None:
            self._log_death(proc)
        while self.restarts < self.max_restarts:
            self.restarts += 1
            logger.warning(
                "dask_otel_spans: starting a new export process (%d of at most %d "
                "restarts)", self.restarts, self.max_restarts,
            )
            try:
                self.launch()
                return self._proc
            except ExportProcessError as e:
                logger.error("dask_otel_spans: the export process did not start: %s", e)
        self._gave_up = True
        logger.error(
            "dask_otel_spans: no export process after %d restarts; spans and metrics "
            "are dropped from now on (counted in ExportProcess.lost)", self.restarts,
        )
        return None

    @staticmethod
    def _end(proc: subprocess.Popen, reader: threading.Thread | None,
             timeout: float) -> None:
        """Close the child's stdin (it finishes and exits), wait, then kill."""
        try:
            proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            logger.error(
                "dask_otel_spans: the export process (pid %d) did not finish within "
                "%ss; killed", proc.pid, timeout,
            )
            proc.kill()
            proc.wait()
        if reader is not None:
            reader.join(timeout)
        try:
            proc.stdout.close()
        except OSError:
            pass

    # -- what the plugin calls -----------------------------------------------------

    def send(self, messages: list[tuple[Any, ...]]) -> None:
        """Queue messages of the protocol (:mod:`~dask_otel_spans.protocol.events`) for the
        export process, in order; never blocks. Past the budget they are dropped
        and counted (:class:`~dask_otel_spans.transport.budget.ForwardBudget`)."""
        if messages and self.budget.admit(messages):
            self.put(messages)

    @property
    def waiting(self) -> int:
        """Messages sent and not yet written to the export process (or lost)."""
        return self.budget.waiting

    def stats(self) -> dict[str, Any]:
        """The export process's figures as last reported, its counts with those
        of the children that died; and what this side lost or dropped."""
        out = dict(self.child_stats)
        out["exported"] = self.exported_count
        for name in _CUMULATIVE:
            out[name] = self.child_total(name)
        out["lost"] = self.lost
        out["dropped_by_kind"] = dict(self.budget.dropped_by_kind)
        out["waiting"] = self.waiting
        return out

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until the export process exported everything queued so far; False
        when it did not answer within ``timeout`` seconds (or is gone)."""
        if self._thread is None:
            return True
        timeout = 10.0 if timeout is None else timeout
        deadline = time.monotonic() + timeout
        token = next(self._tokens)
        flush = self._flushes[token] = _Flush()
        try:
            self._queue.put(("flush", token, timeout), timeout=timeout)
        except Exception:
            self._flushes.pop(token, None)
            return False
        flush.done.wait(max(0.0, deadline - time.monotonic()))
        self._flushes.pop(token, None)
        return flush.ok

    def stop(self, timeout: float = 10) -> None:
        """Send what is queued, then let the export process finish its exports and
        exit (killed after ``timeout`` seconds)."""
        super().stop(timeout)
        self._stopping = True
        proc, self._proc = self._proc, None
        if proc is not None:
            self._end(proc, self._reader, timeout)
        self._reader = None

    # -- the sender thread ---------------------------------------------------------

    def handle(self, item: Any) -> None:
        if type(item) is list:
            self._batch.extend(item)
        else:  # ("flush", token, timeout)
            self._batch.append(item)
            self.settle()
            return
        if len(self._batch) >= _BATCH_SIZE:
            self.settle()

    def _encode(self, batch: list[tuple[Any, ...]]) -> bytes:
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
                        "ExportProcess.lost)", item[0], type(e).__name__, e,
                    )
                continue
            kept.append(item)
        return encode_batch(kept)

    def _new_history(self) -> tuple[list[tuple[Any, ...]], int]:
        """The "history" message with the entries of ``nthreads_history`` the
        running child has not had yet (none when it has them all), and the length
        it will then have. O(new entries), not O(history)."""
        history, sent = self.nthreads_history, self._history_sent
        if history is None:
            return [], sent
        n = len(history)
        if n <= sent:
            return [], sent
        return [("history", sent, tuple(history[sent:n]))], n

    def next_settle_in(self) -> float | None:
        return 0.0 if self._batch else None

    def settle(self) -> None:
        """Write the batch to the export process."""
        batch, self._batch = self._batch, []
        if not batch:
            return
        try:
            self._write(batch)
        finally:
            self.budget.written += sum(1 for item in batch if item[0] != "flush")

    def _write(self, batch: list[tuple[Any, ...]]) -> None:
        for _ in range(2):  # the running child, or else a new one
            proc = self._live_child()
            if proc is None:
                break
            history_message, history_len = self._new_history()
            frame = self._encode(history_message + batch)
            try:
                proc.stdin.write(frame)
                proc.stdin.flush()
                self._history_sent = history_len
                return
            except (OSError, ValueError):
                try:
                    proc.wait(1.0)
                except subprocess.TimeoutExpired:
                    proc.kill()
        self.lost += sum(1 for item in batch if item[0] != "flush")
        for item in batch:
            if item[0] == "flush":
                flush = self._flushes.pop(item[1], None)
                if flush is not None:
                    flush.done.set()

"""Supervision of the export process: start it and wait until it is ready, read its
answers (its figures, flush results) on a reader thread, say when it died, start a
new one (at most ``max_restarts`` times), end it. Sending to it is the
:class:`~dask_otel_spans.transport.sender.ChildSender`'s."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from itertools import count
from typing import IO

from dask_otel_spans.otelenv import AUTO_INSTRUMENTATION
from dask_otel_spans.protocol.figures import ExportFigures
from dask_otel_spans.protocol.wire import (
    Answer,
    Destinations,
    Figures,
    Flushed,
    HandedOver,
    Ready,
    SetupFailed,
    Stopped,
    read_frame,
    write_frame,
)
from dask_otel_spans.transport.places import Places
from dask_otel_spans.transport.spec import PipelineSpec

logger = logging.getLogger(__name__)

#: Nice levels the export process runs below the scheduler: where they share a core,
#: the scheduler's event loop goes first
EXPORT_PROCESS_NICE = 10
#: Seconds a new child's launch waits for the reader of the one that ended to read
#: what it said to its end
READER_JOIN_TIMEOUT = 5.0
#: Counts of a child's figures that go on over a restart (:meth:`ChildSupervisor.total`)
#: The module the export process runs (``python -m``)
CHILD_MODULE = "dask_otel_spans.transport.child"


class ExportProcessError(RuntimeError):
    """The export process could not be started.

    ``setup_failed``: it started but could not set up its exporters (the scheduler
    process could not either); otherwise it did not start or answer."""

    def __init__(self, reason: str, setup_failed: bool = False):
        super().__init__(reason)
        self.setup_failed = setup_failed


class Flush:
    """A flush waiting for the export process's answer."""

    __slots__ = ("token", "done", "ok")

    def __init__(self, token: int) -> None:
        self.token = token
        self.done = threading.Event()
        self.ok = False


class ChildSupervisor:
    """Start, watch, restart and end the export process.

    A new child knows nothing of the spans forwarded to the one before: what the
    dead one held (spans not handed over yet, metric sums since its last export) is
    lost, and its counts are kept apart (:meth:`total`). ``launches`` counts the
    children: the plugin forwards the running spans again to a new one, and the
    done ones not in ``handed_over``.

    Parameters
    ----------
    spec:
        How the child builds its providers
    start_timeout:
        Seconds to wait for a child to report ready
    max_restarts:
        Children started after the first one died
    nice:
        Nice levels the child runs below this process: 0 for the same priority
    cpu_policy:
        How the child's threads are scheduled (Linux): ``"idle"``, ``"batch"`` or
        ``"normal"`` (:data:`~dask_otel_spans.config.CPU_POLICIES`)
    """

    def __init__(
        self,
        spec: PipelineSpec,
        *,
        start_timeout: float = 60.0,
        max_restarts: int = 3,
        nice: int = 0,
        cpu_policy: str = "normal",
    ):
        self.spec = spec
        self.start_timeout = start_timeout
        self.max_restarts = max_restarts
        self.nice = max(0, int(nice))
        self.cpu_policy = cpu_policy
        self.restarts = 0
        #: children started so far
        self.launches = 0
        #: the running child's figures (the session's), as last reported
        self.child_figures = ExportFigures()
        #: what the child said when it was ready: where traces and metrics go, pid
        self.info: Destinations = {}
        #: the places in the scheduler's span dict of the spans the export processes
        #: said they hand over (:class:`~dask_otel_spans.protocol.wire.HandedOver`)
        self.handed_over = Places()
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._flushes: dict[int, Flush] = {}
        self._tokens = count(1)
        self._stopping = False
        self._gave_up = False
        #: pids of children whose end was logged
        self._deaths_logged: set[int] = set()
        #: the child whose figures ``child_figures`` holds
        self._figures_pid: int | None = None
        #: counts of the children that died, of the figures :meth:`total` reads
        self._counts_of_dead: dict[str, int] = {}

    # -- the child's figures -----------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def child_running(self) -> bool:
        """Whether the export process runs (False once it ended and was reaped)."""
        proc = self._proc
        return proc is not None and proc.poll() is None

    def total(self, name: str) -> int:
        """A count of the export processes (one of ``ExportFigures.CUMULATIVE``), as
        last reported, with those of children that died."""
        return self._counts_of_dead.get(name, 0) + int(getattr(self.child_figures, name))

    def figures(self) -> ExportFigures:
        """The running child's figures, its counts with those of the dead ones."""
        return self.child_figures.plus_counts(self._counts_of_dead)

    # -- start, restart, end -----------------------------------------------------------

    def launch(self) -> Destinations:
        """Start a child and wait until it is ready; its ``info``."""
        env = dict(os.environ)
        # the child imports what this process imports (e.g. a providers factory),
        # but does not run under auto-instrumentation: it builds its providers from
        # OTEL_* itself (``opentelemetry-instrument`` puts its sitecustomize folder on
        # PYTHONPATH)
        launcher = AUTO_INSTRUMENTATION.replace(".", os.sep)
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(
            p for p in sys.path if p and not p.rstrip(os.sep).endswith(launcher)
        ))
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", CHILD_MODULE,
                 "--nice", str(self.nice), "--cpu-policy", self.cpu_policy],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
            )
        except (OSError, ValueError) as e:
            raise ExportProcessError(f"cannot start {sys.executable}: {e}") from e
        ready = threading.Event()
        answer: list[Ready | SetupFailed] = []  # (the reader puts the first one)
        reader = threading.Thread(
            target=self._read, args=(proc, ready, answer),
            name="dask-otel-spans-export-reader", daemon=True,
        )
        reader.start()
        try:
            write_frame(_stdin(proc), self.spec)
        except (OSError, ValueError):
            pass  # the reader sees the child end
        first = answer[0] if ready.wait(self.start_timeout) and answer else None
        if not isinstance(first, Ready):
            if isinstance(first, SetupFailed):
                reason = first.reason
            elif proc.poll() is None:
                reason = f"no answer within {self.start_timeout}s"
            else:
                reason = f"exit code {proc.poll()}"
            self._end(proc, reader, timeout=1.0)
            raise ExportProcessError(reason, setup_failed=isinstance(first, SetupFailed))
        previous, self._proc, self._reader = self._reader, proc, reader
        if previous is not None:
            # (what the child that ended said is read to its end first: a span it
            # said it handed over is not forwarded again)
            previous.join(READER_JOIN_TIMEOUT)
        for name in ExportFigures.CUMULATIVE:
            self._counts_of_dead[name] = self.total(name)
        self.child_figures = ExportFigures()
        # (last: the plugin reads a new launch, then the place to go on from)
        self.launches += 1
        self._figures_pid = proc.pid
        self.info = first.destinations
        return self.info

    def live_child(self) -> subprocess.Popen[bytes] | None:
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
            "are dropped from now on (counted in ChildSender.lost)", self.restarts,
        )
        return None

    def stop(self, timeout: float) -> None:
        """Close the child's stdin (it finishes and exits), wait, then kill."""
        self._stopping = True
        proc, self._proc = self._proc, None
        if proc is not None:
            self._end(proc, self._reader, timeout)
        self._reader = None

    @staticmethod
    def _end(proc: subprocess.Popen[bytes], reader: threading.Thread | None,
             timeout: float) -> None:
        try:
            _stdin(proc).close()
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
            _stdout(proc).close()
        except OSError:
            pass

    # -- flushes -------------------------------------------------------------------------

    def expect_flush(self) -> Flush:
        """A new flush, answered by the child's
        :class:`~dask_otel_spans.protocol.wire.Flushed` (or failed when it ends)."""
        flush = Flush(next(self._tokens))
        self._flushes[flush.token] = flush
        return flush

    def end_flush(self, token: int) -> None:
        """Give up waiting for a flush (answered, timed out or never sent)."""
        flush = self._flushes.pop(token, None)
        if flush is not None:
            flush.done.set()

    # -- the reader thread ---------------------------------------------------------------

    def _read(self, proc: subprocess.Popen[bytes], ready: threading.Event,
              answer: list[Ready | SetupFailed]) -> None:
        """Reader thread of one child: its answers, until its stdout ends."""
        try:
            while True:
                self._take(proc, read_frame(_stdout(proc)), ready, answer)
        except EOFError:
            pass
        except Exception:
            logger.exception("dask_otel_spans: unreadable answer from the export process")
        finally:
            ready.set()
            if proc is self._proc and not self._stopping:
                self._log_death(proc)
            if proc is self._proc:
                for token in list(self._flushes):
                    self.end_flush(token)

    def _take(self, proc: subprocess.Popen[bytes], message: Answer,
              ready: threading.Event, answer: list[Ready | SetupFailed]) -> None:
        """One answer of the child ``proc``."""
        match message:
            case Ready() | SetupFailed():
                answer.append(message)
                ready.set()
            case HandedOver(found):
                self.handed_over.add_runs(found)
            case Figures(figures) | Stopped(figures):
                if proc.pid == self._figures_pid:
                    self.child_figures = figures
            case Flushed(token, ok, figures):
                if proc.pid == self._figures_pid:
                    self.child_figures = figures
                flush = self._flushes.get(token)
                if flush is not None:
                    flush.ok = bool(ok)
                    self.end_flush(token)

    def _log_death(self, proc: subprocess.Popen[bytes]) -> None:
        """Log, once per child, that it ended while the scheduler needed it."""
        if proc.pid in self._deaths_logged:
            return
        self._deaths_logged.add(proc.pid)
        logger.error(
            "dask_otel_spans: the export process (pid %d) exited with code %s; spans "
            "and metric sums it had not exported yet are lost, batches it held in "
            "its spool directory are sent by the next one", proc.pid, proc.wait(),
        )


def _stdin(proc: subprocess.Popen[bytes]) -> IO[bytes]:
    assert proc.stdin is not None  # (started with stdin=PIPE)
    return proc.stdin


def _stdout(proc: subprocess.Popen[bytes]) -> IO[bytes]:
    assert proc.stdout is not None  # (started with stdout=PIPE)
    return proc.stdout

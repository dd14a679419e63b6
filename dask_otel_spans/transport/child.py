"""The export process: runs the export session (span tree copy, readiness tracker,
translation, OTel SDK, exporters) on what the scheduler's plugin forwards over its
stdin, outside the scheduler process.

Started by :class:`~dask_otel_spans.transport.supervisor.ChildSupervisor` as
``python -m dask_otel_spans.transport.child``. Protocol (frames of
:mod:`~dask_otel_spans.protocol.wire`):

- stdin, first frame: a :class:`~dask_otel_spans.transport.spec.PipelineSpec`; then
  batches (lists) of the messages of :mod:`~dask_otel_spans.protocol.events`, and
  flushes. End of stdin: hand over the spans still open, finish, shut down, exit.
- stdout: its answers, :data:`~dask_otel_spans.protocol.wire.Answer`: ``Ready`` or
  ``SetupFailed``; ``HandedOver`` before it hands spans over; ``Figures`` when they
  changed; ``Flushed`` for each flush; ``Stopped``.

Anything else the process prints goes to stderr, as do its log lines.
"""
from __future__ import annotations

import argparse
import functools
import gc
import logging
import os
import signal
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable
from typing import IO

import psutil

from dask_otel_spans.config import CPU_POLICIES
from dask_otel_spans.export.pipeline import ExportPipeline
from dask_otel_spans.export.session import ExportSession
from dask_otel_spans.protocol.events import Message
from dask_otel_spans.protocol.figures import ExportFigures, ProcessFigures
from dask_otel_spans.protocol.wire import (
    Answer,
    Figures,
    Flushed,
    HandedOver,
    Ready,
    SetupFailed,
    Stopped,
    is_flush,
    read_flush,
    read_frame,
    write_frame,
)
from dask_otel_spans.transport.places import runs
from dask_otel_spans.transport.providers import build_providers
from dask_otel_spans.transport.spec import PipelineSpec

logger = logging.getLogger("dask_otel_spans.transport.child")

#: Seconds between two looks at whether the figures changed
_FIGURES_INTERVAL = 0.5
#: Allocations between two collections of the garbage collector's youngest
#: generation in this process (Python's default: 700; :func:`settle_garbage_collector`)
YOUNG_GC_THRESHOLD = 10_000
#: Objects that :func:`settle_garbage_collector` left out of collections
_frozen_objects = 0
#: CPU seconds this process spent in garbage collections (thread CPU while one ran)
_gc_cpu = [0.0]
_gc_started: dict[int, float] = {}


def _time_collections(phase: str, info: dict[str, int]) -> None:
    """``gc.callbacks`` entry: account each collection's CPU time."""
    thread = threading.get_ident()
    if phase == "start":
        _gc_started[thread] = time.thread_time()
    else:
        started = _gc_started.pop(thread, None)
        if started is not None:
            _gc_cpu[0] += time.thread_time() - started


class _Outbox:
    """The frames to the scheduler: one writer at a time; a closed pipe (the
    scheduler went away) is ignored."""

    def __init__(self, stream: IO[bytes]):
        self._stream = stream
        self._lock = threading.Lock()

    def send(self, message: Answer) -> None:
        with self._lock:
            self._write(message)

    def send_with_figures(self, answer: Callable[[ExportFigures], Answer],
                          session: ExportSession) -> None:
        """Send ``answer(figures)``, the session's figures taken while no other frame
        is sent: of two answers with figures (the stats thread's and a flush's), the
        later one sent holds the later figures."""
        with self._lock:
            self._write(answer(_figures(session)))

    def _write(self, message: Answer) -> None:
        try:
            write_frame(self._stream, message)
        except (OSError, ValueError):
            pass


def _say_handed_over(outbox: _Outbox) -> Callable[[list[int]], None]:
    """The session's ``before_hand_over``: say the places of the spans about to be
    handed over (:class:`~dask_otel_spans.protocol.wire.HandedOver`) before they are.
    Should this process die, the scheduler sends the next one the done spans it had
    not handed over, and none it had."""

    def say(places: list[int]) -> None:
        outbox.send(HandedOver(runs(places)))

    return say


def settle_garbage_collector() -> None:
    """Set this process's garbage collector for the work it does: decoding frames of
    small tuples and dropping them once applied.

    What is alive once the process is set up (the modules of the OTel SDK, of
    ``distributed`` and of this package, and the providers) lives as long as the
    process: :func:`gc.freeze` leaves it out of every later collection, which
    otherwise walks it on each full one. The frames' young tuples die in the next
    batch or two; collecting the youngest generation every
    :data:`YOUNG_GC_THRESHOLD` allocations instead of 700 visits far fewer of them
    (a few hundred KiB more of them alive between collections at most). On the
    nested workload the collector took a fifth to a quarter of this process's CPU
    before (run BL, benchmarks/README.md).
    """
    global _frozen_objects
    gc.collect()
    gc.freeze()
    _frozen_objects = gc.get_freeze_count()  # (walks them: counted once, here)
    young, middle, old = gc.get_threshold()
    if young:  # (0: the collector was turned off; left so)
        gc.set_threshold(max(young, YOUNG_GC_THRESHOLD), middle, old)
    gc.callbacks.append(_time_collections)


def process_figures() -> ProcessFigures:
    """This process's CPU seconds, garbage collector and memory: resident set size,
    and Python's allocations still alive when ``tracemalloc`` traces
    (``PYTHONTRACEMALLOC=1`` in the scheduler's environment)."""
    try:
        rss: int | None = psutil.Process().memory_info().rss
    except psutil.Error:  # pragma: no cover - /proc unreadable
        rss = None
    return ProcessFigures(
        pid=os.getpid(), cpu_s=time.process_time(), rss_bytes=rss,
        traced_bytes=(tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing()
                      else None),
        gc_frozen_objects=_frozen_objects, gc_young_threshold=gc.get_threshold()[0],
        gc_cpu_s=_gc_cpu[0],
        gc_collections=tuple(figures["collections"] for figures in gc.get_stats()),
    )


def _figures(session: ExportSession) -> ExportFigures:
    """The session's figures, with this process's."""
    return session.figures().replace(process=process_figures())


def report_figures(session: ExportSession, outbox: _Outbox,
                   stopped: threading.Event) -> None:
    """Send the session's figures when they changed (CPU and memory, which always
    change, are not compared), every :data:`_FIGURES_INTERVAL` at most."""
    last: ExportFigures | None = None
    failed = False
    while not stopped.wait(_FIGURES_INTERVAL):
        try:
            figures = session.figures().replace(session_cpu_s=0.0)
            if figures != last:
                last = figures
                outbox.send_with_figures(Figures, session)
        except Exception:
            # (the scheduler waits on these figures: the thread carries on)
            if not failed:
                failed = True
                logger.exception("dask_otel_spans: cannot report the export "
                                 "process's figures (logged once)")


def serve(inbox: IO[bytes], outbox: _Outbox) -> int:
    """Build the session from the first frame, then feed it until ``inbox`` ends."""
    try:
        spec: PipelineSpec = read_frame(inbox)
        pipeline = ExportPipeline.build(build_providers(spec), spec.config, spec.environ)
    except EOFError:
        return 0
    except Exception as e:
        # (the scheduler says it, once, with what it does instead)
        outbox.send(SetupFailed(f"{type(e).__name__}: {e}"))
        return 1
    outbox.send(Ready(
        {
            "traces_to": pipeline.providers.traces_to,
            "metrics_to": pipeline.providers.metrics_to,
            "exceptions_to": pipeline.providers.exceptions_to,
            "pid": os.getpid(),
        },
    ))
    session = ExportSession(pipeline, spec.config)
    session.before_hand_over = _say_handed_over(outbox)
    session.start()
    settle_garbage_collector()
    stopped = threading.Event()
    reporter = threading.Thread(
        target=report_figures, args=(session, outbox, stopped),
        name="dask-otel-spans-export-stats", daemon=True,
    )
    reporter.start()
    bad_frames = 0
    while True:
        try:
            batch = read_frame(inbox)
        except EOFError:
            break
        except Exception:
            bad_frames += 1
            if bad_frames == 1:
                logger.exception("dask_otel_spans: unreadable frame from the scheduler "
                                 "(logged once)")
            continue
        messages: list[Message] = []
        for message in batch:
            if not is_flush(message):
                messages.append(message)
                continue
            session.send(messages)
            messages = []
            flush = read_flush(message)
            ok = session.flush(flush.timeout, exporters=flush.exporters)
            outbox.send_with_figures(functools.partial(Flushed, flush.token, ok), session)
        session.send(messages)
    stopped.set()
    session.stop(spec.config.shutdown_timeout)
    outbox.send_with_figures(Stopped, session)
    return 0


def _own_threads() -> list[int]:
    """Ids of this process's threads where the system lists them (Linux keeps the
    nice level and scheduling policy per thread), else ``[0]``: the process."""
    try:
        return [int(tid) for tid in os.listdir("/proc/self/task")]
    except (OSError, ValueError):
        return [0]


#: ``export-process-cpu-policy`` -> the name of its scheduling policy in ``os``
_POLICY_NAMES = {"idle": "SCHED_IDLE", "batch": "SCHED_BATCH"}


def lower_priority(increment: int, policy: str = "normal") -> None:
    """Run this process ``increment`` nice levels lower and, where the system has
    it, under scheduling ``policy``: ``"idle"`` (``SCHED_IDLE``: its threads run on
    CPU time nothing else wants), ``"batch"`` (``SCHED_BATCH``: never preempts a
    running thread when it wakes) or ``"normal"`` (left as it is). On a core it
    shares with the scheduler, the scheduler's event loop goes first. Every thread
    running now is moved (importing ``distributed`` starts one); threads started
    later inherit it. Where it is not allowed, says so once and goes on."""
    name = _POLICY_NAMES.get(policy)
    sched = getattr(os, name, None) if name else None
    if name and sched is None:
        logger.info("dask_otel_spans: this system has no %s; the export process "
                    "keeps the scheduler's scheduling policy", name)
    if increment <= 0 and sched is None:
        return
    try:
        level = min(19, os.getpriority(os.PRIO_PROCESS, 0) + max(0, increment))
        for tid in _own_threads():
            try:
                if increment > 0:
                    os.setpriority(os.PRIO_PROCESS, tid, level)
                if sched is not None:
                    os.sched_setscheduler(tid, sched, os.sched_param(0))
            except ProcessLookupError:
                continue  # a thread that ended meanwhile
    except (AttributeError, OSError) as e:
        logger.info("dask_otel_spans: the export process could not lower its CPU "
                    "priority (%s)", e)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dask_otel_spans.transport.child")
    parser.add_argument("--nice", type=int, default=0,
                        help="nice levels below the parent (the scheduler)")
    parser.add_argument("--cpu-policy", choices=CPU_POLICIES,
                        default="normal", help="scheduling policy of its threads")
    args = parser.parse_args(argv)
    # The protocol owns the real stdout; stray prints (e.g. a console exporter) go
    # to stderr with the log lines.
    protocol_out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    # Ctrl-C or a TERM sent to the scheduler's process group must not end the export
    # before the scheduler's final spans are in: this process ends when its stdin
    # does (the scheduler closed it, or exited).
    for sig in (signal.SIGINT, getattr(signal, "SIGTERM", None)):
        if sig is not None:
            signal.signal(sig, signal.SIG_IGN)
    logging.basicConfig(
        level=logging.WARNING,
        format="%(asctime)s - dask_otel_spans export process - %(levelname)s - "
        "%(message)s",
    )
    logging.getLogger("dask_otel_spans").setLevel(logging.INFO)
    lower_priority(args.nice, args.cpu_policy)
    return serve(sys.stdin.buffer, _Outbox(protocol_out))


if __name__ == "__main__":  # pragma: no cover - run as a child process
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Not sys.exit: the SDK's exit handlers would shut the providers down again and
    # wait for an unreachable collector past the shutdown timeout already spent.
    os._exit(code)

"""The workers' statistical profiles of a span's task prefixes, fetched as
``Scheduler.get_profile(start=, stop=, key=prefix)`` gathers them: once a prefix of a
span is done, and by windows while it runs; asynchronous and bounded, off the event
loop's critical path. The forwarder's messages say when (:meth:`ProfileFetcher.tap`:
a glance at each message's kind); the profiles go to the export side as ``profile``
messages."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import dask.config
from dask.utils import parse_timedelta
from distributed.metrics import time
from tornado.ioloop import PeriodicCallback

from dask_otel_spans.logonce import OnceLogger
from dask_otel_spans.protocol import events
from dask_otel_spans.protocol.dask_facts import group_done
from dask_otel_spans.protocol.events import Message

if TYPE_CHECKING:
    from distributed import Scheduler
    from distributed.scheduler import TaskGroup

    from dask_otel_spans.config import PluginConfig
    from dask_otel_spans.scheduler.forwarder import Sink

logger = logging.getLogger(__name__)

#: How many times ``profile.timeout`` a done span waits for its profile on the export
#: side: the prefix's window before (awaited first), a turn among the requests, the
#: request, each ``profile.timeout`` at most
WAIT_FACTOR = 3.0


def history_seconds() -> tuple[float, float]:
    """``(cycle, seconds)``: a worker's profile cycle and how far back its history
    reaches (``distributed.admin.low-level-log-length`` cycles), as this process's
    dask config says."""
    cycle = parse_timedelta(dask.config.get("distributed.worker.profile.cycle"),
                            default="ms") or 1.0
    length = dask.config.get("distributed.admin.low-level-log-length", default=1000)
    return cycle, cycle * (length if isinstance(length, int) and length > 0 else 1000)


class ProfileFetcher:
    """Fetch the profile of each task prefix of a span with enough task time.

    Parameters
    ----------
    scheduler:
        The scheduler (its spans extension, workers, ``rpc``, task prefixes)
    sink:
        Where the ``profile`` messages go (the forwarder's transport)
    config:
        ``profile.*`` settings
    clock:
        The scheduler's clock
    """

    def __init__(self, scheduler: Scheduler, sink: Sink, config: PluginConfig,
                 clock: Callable[[], float] = time):
        self.scheduler = scheduler
        self.sink = sink
        self.min_seconds = config.profile_min_seconds
        self.timeout = config.profile_timeout
        self.window = config.profile_window
        self.max_fetches = config.profile_max_fetches
        self.clock = clock
        self.cycle, self.history = history_seconds()
        #: (span id, prefix) -> end of the last window fetched
        self._fetched_until: dict[tuple[str, str], float] = {}
        #: (span id, prefix) of groups seen running, not done yet -> when first seen
        self._running: dict[tuple[str, str], float] = {}
        #: (span id, prefix) -> its groups seen running and not done (ids), and the
        #: task time of those of its groups done while others ran
        self._open_groups: dict[tuple[str, str], set[object]] = {}
        self._task_time: dict[tuple[str, str], float] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        #: (span id, prefix) -> its latest fetch not done
        self._latest: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._semaphore: asyncio.Semaphore | None = None
        self._pc: PeriodicCallback | None = None
        self._log_once = OnceLogger(logger)
        #: profile requests made (one per window), and windows skipped
        self.fetches = 0
        self.skipped = 0

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        """Fetch running prefixes' windows every ``profile.window``."""
        self._pc = PeriodicCallback(self._windows, self.window * 1000)
        self._pc.start()

    def close(self) -> None:
        """Stop; fetches under way are cancelled (their spans are exported without)."""
        if self._pc is not None:
            self._pc.stop()
        for task in list(self._tasks):
            task.cancel()

    # -- what the forwarder sends ----------------------------------------------------

    def tap(self, messages: list[Message]) -> list[Message]:
        """``messages`` as the forwarder sends them, with a ``profile-pending`` before
        the ``done`` of each group that completes a prefix of its span worth a
        profile; notes the prefixes that run. O(messages): a span's groups are read
        only when a prefix with enough task time has none running any more."""
        out = None
        for i, message in enumerate(messages):
            kind = message[0]
            fields: tuple[object, ...] = message[1:]
            if kind == events.RUN:
                key = (str(fields[0]), str(fields[2]))
                self._running.setdefault(key, self.clock())
                self._open_groups.setdefault(key, set()).add(fields[1])
            elif kind == events.DONE:
                # (figures: prefix, start, stop, nbytes, duration, ...: done_figures)
                figures = fields[2]
                if not isinstance(figures, tuple) or len(figures) < 5:
                    continue
                pending = self._group_done(str(fields[0]), fields[1], str(figures[0]),
                                           float(figures[4]))
                if pending is not None:
                    if out is None:
                        out = list(messages[:i])
                    out.append(pending)
            if out is not None:
                out.append(message)
        return messages if out is None else out

    def send(self, messages: list[Message]) -> None:
        """The sink's ``send``, tapped."""
        try:
            messages = self.tap(messages)
        except Exception:
            self._log_once.failure("profile-tap")
        self.sink.send(messages)

    # -- when --------------------------------------------------------------------------

    def _groups(self, span_id: str, prefix: str) -> list[TaskGroup]:
        ext = self.scheduler.extensions.get("spans")
        span = ext.spans.get(span_id) if ext is not None else None
        if span is None:
            return []
        return [tg for tg in list(span.groups) if tg.prefix.name == prefix]

    def _group_done(self, span_id: str, group: object, prefix: str,
                    duration: float) -> Message | None:
        """A group of a prefix of the span is done: the prefix's ``profile-pending``
        when it has no group running any more and enough task time."""
        key = (span_id, prefix)
        running = self._open_groups.get(key)
        if running:
            running.discard(group)
            if running:
                self._task_time[key] = self._task_time.get(key, 0.0) + duration
                return None
        self._open_groups.pop(key, None)
        task_time = self._task_time.pop(key, 0.0) + duration
        if task_time < self.min_seconds and key not in self._fetched_until:
            self._running.pop(key, None)
            return None
        return self._prefix_done(span_id, prefix)

    def _prefix_done(self, span_id: str, prefix: str) -> Message | None:
        groups = self._groups(span_id, prefix)
        if not groups or not all(group_done(tg) for tg in groups):
            return None
        key = (span_id, prefix)
        window = self._window_of(key, groups, final=True)
        self._running.pop(key, None)
        self._fetched_until.pop(key, None)
        if window is None:
            return None
        self._spawn(span_id, prefix, *window, final=True)
        return events.profile_pending(span_id, prefix,
                                      self.timeout * WAIT_FACTOR + self.cycle)

    def _window_of(self, key: tuple[str, str], groups: list[TaskGroup],
                   final: bool) -> tuple[float, float] | None:
        """The interval still to fetch of a prefix of a span, None when its task
        time is below ``profile.min-seconds`` or nothing is left. A group's start
        counts its finished tasks only: the time it was first seen running goes too."""
        starts = [tg.start for tg in groups if tg.start]
        if key in self._running:
            starts.append(self._running[key])
        if not starts:
            return None
        start = min(starts)
        until = self._fetched_until.get(key)
        task_time = sum(tg.duration for tg in groups)
        if final:
            stop = max(tg.stop for tg in groups)
        else:  # (and the tasks running now, so far)
            stop = self.clock()
            running = sum(tg.states.get("processing", 0) for tg in groups)
            task_time += running * (stop - max(start, until or start))
        if task_time < self.min_seconds:
            return None
        if until is not None:
            # windows meet at whole profile cycles: the one holding ``until`` went
            # with the window before
            start = max(start, until + self.cycle)
        if stop < start:
            return None
        return start, stop

    def _windows(self) -> None:
        """Every ``profile.window``: a window of each prefix still running whose
        last window (or start) is that old."""
        now = self.clock()
        for key in list(self._running):
            try:
                groups = self._groups(*key)
                if not groups:  # (the span is gone)
                    self._running.pop(key, None)
                    self._open_groups.pop(key, None)
                    self._task_time.pop(key, None)
                    continue
                since = self._fetched_until.get(key) or min(
                    [tg.start for tg in groups if tg.start] + [self._running[key]])
                if now - since < self.window:
                    continue
                window = self._window_of(key, groups, final=False)
                if window is not None:
                    self._fetched_until[key] = window[1]
                    self._spawn(*key, *window, final=False)
            except Exception:
                self._log_once.failure("profile-window")

    # -- fetch -------------------------------------------------------------------------

    def _spawn(self, span_id: str, prefix: str, start: float, stop: float,
               final: bool) -> None:
        key = (span_id, prefix)
        task = asyncio.ensure_future(self._fetch(span_id, prefix, start, stop, final,
                                                 self._latest.get(key)))
        self._tasks.add(task)
        self._latest[key] = task

        def forget(task: asyncio.Task[None]) -> None:
            self._tasks.discard(task)
            if self._latest.get(key) is task:
                del self._latest[key]

        task.add_done_callback(forget)

    async def _fetch(self, span_id: str, prefix: str, start: float, stop: float,
                     final: bool, after: asyncio.Task[None] | None = None) -> None:
        trees: list[dict[str, object]] = []
        missing: list[str] = []
        try:
            if after is not None:
                # a prefix's windows reach the export side in order, the last one
                # last (it releases the span)
                await asyncio.wait([after], timeout=self.timeout)
            if self._semaphore is None:
                self._semaphore = asyncio.Semaphore(self.max_fetches)
            try:
                await asyncio.wait_for(self._semaphore.acquire(), self.timeout)
            except asyncio.TimeoutError:
                self.skipped += 1
                missing.append(f"{stop - start:.1f} s not asked for: more profile "
                               "requests than profile.max-fetches for profile.timeout")
            else:
                try:
                    trees = await self._ask(prefix, start, stop, missing)
                finally:
                    self._semaphore.release()
            shared = self.shared_spans(span_id, prefix, start, stop)
        except asyncio.CancelledError:
            raise
        except Exception:
            self._log_once.failure("profile-fetch")
            shared = 0
            missing.append("the request failed")
        self.sink.send([events.profile(span_id, prefix, start, stop, trees, shared,
                                       "; ".join(missing), final)])

    async def _ask(self, prefix: str, start: float, stop: float,
                   missing: list[str]) -> list[dict[str, object]]:
        """The workers' trees of ``prefix`` over the window (the part their history
        still holds), as ``Scheduler.get_profile`` asks them."""
        oldest = self.clock() - self.history + self.cycle
        if stop < oldest:
            self.skipped += 1
            logger.info("dask_otel_spans: no profile of %r from %.0f s ago: the "
                        "workers' profile history (distributed.admin."
                        "low-level-log-length cycles) no longer holds it", prefix,
                        self.clock() - stop)
            missing.append(f"{stop - start:.1f} s no longer in the workers' history")
            return []
        if start < oldest:
            if oldest - start > self.cycle:  # (less is the windows' granularity)
                missing.append(f"the first {oldest - start:.1f} s no longer in the "
                               "workers' history")
            start = oldest
        self.fetches += 1
        scheduler = self.scheduler
        workers = list(scheduler.workers)
        asked = [asyncio.ensure_future(
            scheduler.rpc(w).profile(start=start, stop=stop, key=prefix, server=False))
            for w in workers]
        if not asked:
            return []
        done, pending = await asyncio.wait(asked, timeout=self.timeout)
        for task in pending:
            task.cancel()
        trees = []
        failed = len(pending)
        for task in done:
            result = None if task.cancelled() or task.exception() else task.result()
            if isinstance(result, dict):
                if result.get("count"):
                    trees.append(result)
            else:
                failed += 1
        if failed:
            missing.append(f"{failed} of {len(workers)} workers did not answer "
                           f"within {self.timeout:g} s")
        return trees

    def shared_spans(self, span_id: str, prefix: str, start: float,
                     stop: float) -> int:
        """Other spans with a group of ``prefix`` that ran in the window (their
        samples are in the profile too). O(groups of the prefix)."""
        tp = self.scheduler.task_prefixes.get(prefix)
        if tp is None:
            return 0
        others = set()
        for tg in list(tp.groups):
            if tg.span_id is None or tg.span_id == span_id or tg.span_id in others:
                continue
            if group_done(tg):
                ran = bool(tg.start) and tg.start <= stop and tg.stop >= start
            else:  # (its start counts finished tasks only)
                ran = bool(tg.states.get("processing")) or 0 < tg.start <= stop
            if ran:
                others.add(tg.span_id)
        return len(others)


def profiling_sink(scheduler: Scheduler, sink: Sink, config: PluginConfig
                   ) -> tuple[Sink, ProfileFetcher | None]:
    """The sink the forwarder sends to: ``sink`` itself, or with ``profile.enabled``
    a started :class:`ProfileFetcher` in front of it (also returned, to close)."""
    if not (config.profile_enabled and config.prefix_spans):
        return sink, None
    fetcher = ProfileFetcher(scheduler, sink, config)
    fetcher.start()
    return fetcher, fetcher

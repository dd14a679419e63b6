"""The workers' statistical profiles of a span's task prefixes, fetched as
``Scheduler.get_profile(start=, stop=, key=prefix)`` gathers them: once the span is
over, and by windows while it runs, one coroutine per span at a time; asynchronous
and bounded, off the event loop's critical path. The forwarder's messages say when
(:meth:`ProfileFetcher.tap`: a glance at each message's kind); the profiles go to the
export side as ``profile`` messages."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
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


class _Watch:
    """What the fetcher knows of one dask span, from the messages: its groups seen
    running and not done (id -> prefix), the groups a read of the span found not
    done while none ran, and per prefix when it was first seen running, the task
    time of its groups done and the end of its last window fetched."""

    __slots__ = ("open", "waiting", "first_seen", "task_time", "fetched_until",
                 "stale")

    def __init__(self) -> None:
        self.open: dict[object, str] = {}
        self.waiting: set[object] | None = None
        self.first_seen: dict[str, float] = {}
        self.task_time: dict[str, float] = {}
        self.fetched_until: dict[str, float] = {}
        #: all its groups were done at the last ``profile.window`` tick
        self.stale = False


#: A prefix's interval to fetch: ``(prefix, start, stop)``
Window = tuple[str, float, float]


class ProfileFetcher:
    """Fetch the profiles of a span's task prefixes with enough task time: when the
    span is over (none of its groups runs or waits), all its prefixes due in one
    coroutine; while it runs, every ``profile.window``, its running prefixes due and
    those done meanwhile in one coroutine.

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
        #: span id -> what is known of it, while it runs or holds a prefix worth
        #: a profile
        self._spans: dict[str, _Watch] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        #: span id -> its latest fetch not done
        self._latest: dict[str, asyncio.Task[None]] = {}
        self._semaphore: asyncio.Semaphore | None = None
        self._pc: PeriodicCallback | None = None
        self._log_once = OnceLogger(logger)
        #: coroutines scheduled (one per span over, one per running span and
        #: window), profile requests made (one per prefix and window, each to every
        #: worker), and windows skipped
        self.coroutines = 0
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
        """``messages`` as the forwarder sends them, with a ``profile-pending`` for
        each prefix worth a profile before the ``done`` of the group that ends its
        span; notes the groups that run. O(messages): a span's groups are read only
        when none of its groups runs any more and a prefix of it has enough task
        time."""
        out = None
        for i, message in enumerate(messages):
            kind = message[0]
            fields: tuple[object, ...] = message[1:]
            if kind == events.RUN:
                span_id, prefix = str(fields[0]), str(fields[2])
                watch = self._spans.get(span_id)
                if watch is None:
                    watch = self._spans[span_id] = _Watch()
                watch.open[fields[1]] = prefix
                if prefix not in watch.first_seen:
                    watch.first_seen[prefix] = self.clock()
            elif kind == events.DONE:
                # (figures: prefix, start, stop, nbytes, duration, ...: done_figures)
                figures = fields[2]
                if not isinstance(figures, tuple) or len(figures) < 5:
                    continue
                pending = self._group_done(str(fields[0]), fields[1],
                                           str(figures[0]), float(figures[4]))
                if pending:
                    if out is None:
                        out = list(messages[:i])
                    out.extend(pending)
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

    def _groups(self, span_id: str) -> list[TaskGroup] | None:
        """The span's own groups; None when the span is gone."""
        ext = self.scheduler.extensions.get("spans")
        span = ext.spans.get(span_id) if ext is not None else None
        return None if span is None else list(span.groups)

    def _group_done(self, span_id: str, group: object, prefix: str,
                    duration: float) -> list[Message] | None:
        """A group of the span is done: the ``profile-pending`` of its prefixes
        worth a profile when the span is over."""
        watch = self._spans.get(span_id)
        if watch is None:
            if duration < self.min_seconds:  # (nothing else of the span seen)
                return None
            watch = self._spans[span_id] = _Watch()
        watch.open.pop(group, None)
        if watch.waiting:
            watch.waiting.discard(group)
        watch.task_time[prefix] = watch.task_time.get(prefix, 0.0) + duration
        if watch.open or watch.waiting:
            return None
        return self._span_idle(span_id, watch)

    def _span_idle(self, span_id: str, watch: _Watch) -> list[Message] | None:
        """None of the span's groups seen running runs: when no group of it waits
        either, the span is over and its prefixes due are fetched in one coroutine
        (their ``profile-pending`` returned)."""
        due = [p for p, t in watch.task_time.items()
               if t >= self.min_seconds or p in watch.fetched_until]
        if not due:
            del self._spans[span_id]
            return None
        groups = self._groups(span_id)
        if groups is None:
            del self._spans[span_id]
            return None
        waiting: set[object] = {id(tg) for tg in groups if not group_done(tg)}
        if waiting:  # (read again once these are done)
            watch.waiting = waiting
            return None
        del self._spans[span_id]
        by_prefix = _by_prefix(groups)
        windows = []
        for prefix in due:
            window = self._window_of(watch, prefix, by_prefix.get(prefix, []),
                                     final=True)
            if window is not None:
                windows.append((prefix, *window))
            elif prefix in watch.fetched_until:
                # (all fetched by windows: an empty last one, after them, releases
                # the span)
                until = watch.fetched_until[prefix]
                windows.append((prefix, until, until))
        if not windows:
            return None
        self._spawn(span_id, windows, final=True)
        wait = self.timeout * WAIT_FACTOR + self.cycle
        return [events.profile_pending(span_id, prefix, wait)
                for prefix, _, _ in windows]

    def _window_of(self, watch: _Watch, prefix: str, groups: list[TaskGroup],
                   final: bool) -> tuple[float, float] | None:
        """The interval still to fetch of a prefix of a span, None when its task
        time is below ``profile.min-seconds`` or nothing is left. A group's start
        counts its finished tasks only: the time it was first seen running goes too."""
        starts = [tg.start for tg in groups if tg.start]
        if prefix in watch.first_seen:
            starts.append(watch.first_seen[prefix])
        if not starts or not groups:
            return None
        start = min(starts)
        until = watch.fetched_until.get(prefix)
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
        """Every ``profile.window``: of each span still running, a window of each
        running prefix whose last window (or first sight) is that old and of each
        prefix done meanwhile, in one coroutine per span. Reads the groups of
        those spans only."""
        now = self.clock()
        for span_id, watch in list(self._spans.items()):
            try:
                self._window_span(span_id, watch, now)
            except Exception:
                self._log_once.failure("profile-window")

    def _window_span(self, span_id: str, watch: _Watch, now: float) -> None:
        running = set(watch.open.values())
        # (half a window: the ticks jitter, and a prefix that started since the last
        # tick joins the others' window rather than a coroutine of its own a tick
        # later; once aligned, every running prefix is due at each tick)
        due = [p for p in running
               if now - watch.fetched_until.get(p, watch.first_seen.get(p, now))
               >= self.window / 2]
        # prefixes done while the span runs on: their window now (the workers'
        # history would not wait for the span)
        done = [p for p, t in watch.task_time.items() if p not in running
                and (t >= self.min_seconds or p in watch.fetched_until)]
        if not due and not done and not watch.waiting:
            return
        groups = self._groups(span_id)
        if groups is None:  # (the span is gone)
            del self._spans[span_id]
            return
        if all(group_done(tg) for tg in groups):
            # their ``done`` is on its way; seen so a window later, it never came
            if watch.stale:
                del self._spans[span_id]
            watch.stale = True
            return
        by_prefix = _by_prefix(groups)
        windows = []
        for prefix, final in [*((p, False) for p in due), *((p, True) for p in done)]:
            window = self._window_of(watch, prefix, by_prefix.get(prefix, []), final)
            if window is not None:
                watch.fetched_until[prefix] = window[1]
                windows.append((prefix, *window))
        if windows:
            self._spawn(span_id, windows, final=False)

    # -- fetch -------------------------------------------------------------------------

    def _spawn(self, span_id: str, windows: list[Window], final: bool) -> None:
        """One coroutine for the span's windows, after the span's fetch before (its
        windows reach the export side in order, the last one last)."""
        task = asyncio.ensure_future(self._fetch(span_id, windows, final,
                                                 self._latest.get(span_id)))
        self.coroutines += 1
        self._tasks.add(task)
        self._latest[span_id] = task

        def forget(task: asyncio.Task[None]) -> None:
            self._tasks.discard(task)
            if self._latest.get(span_id) is task:
                del self._latest[span_id]

        task.add_done_callback(forget)

    async def _fetch(self, span_id: str, windows: list[Window], final: bool,
                     after: asyncio.Task[None] | None = None) -> None:
        """The span's windows, one prefix after another, in one turn among the
        requests (``profile.max-fetches``) and one ``profile.timeout``; each
        prefix's ``profile`` message sent as its answers are in."""
        sent = 0
        try:
            if after is not None:
                await asyncio.wait([after], timeout=self.timeout)
            if not await self._turn():
                for prefix, start, stop in windows:
                    self.skipped += 1
                    self._send(span_id, prefix, start, stop, [], [
                        f"{stop - start:.1f} s not asked for: more profile requests "
                        "than profile.max-fetches for profile.timeout"], final)
                    sent += 1
                return
            try:
                async for _ in self._each(span_id, windows, final):
                    sent += 1
            finally:
                assert self._semaphore is not None
                self._semaphore.release()
        except asyncio.CancelledError:
            raise
        except Exception:
            self._log_once.failure("profile-fetch")
            for prefix, start, stop in windows[sent:]:
                self.sink.send([events.profile(span_id, prefix, start, stop, [], 0,
                                               "the request failed", final)])

    async def _turn(self) -> bool:
        """Wait for a turn among the requests, ``profile.timeout`` at most."""
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self.max_fetches)
        try:
            await asyncio.wait_for(self._semaphore.acquire(), self.timeout)
        except asyncio.TimeoutError:
            return False
        return True

    async def _each(self, span_id: str, windows: list[Window],
                    final: bool) -> AsyncIterator[None]:
        """Ask for each window, all within one ``profile.timeout``; send each."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        for prefix, start, stop in windows:
            missing: list[str] = []
            trees: list[dict[str, object]] = []
            left = deadline - loop.time()
            if stop <= start:  # (nothing left to ask for)
                pass
            elif left > 0:
                trees = await self._ask(prefix, start, stop, missing, left)
            else:
                self.skipped += 1
                missing.append(f"{stop - start:.1f} s not asked for: the span's "
                               "other prefixes took profile.timeout")
            self._send(span_id, prefix, start, stop, trees, missing, final)
            yield

    def _send(self, span_id: str, prefix: str, start: float, stop: float,
              trees: list[dict[str, object]], missing: list[str], final: bool) -> None:
        shared = self.shared_spans(span_id, prefix, start, stop)
        self.sink.send([events.profile(span_id, prefix, start, stop, trees, shared,
                                       "; ".join(missing), final)])

    async def _ask(self, prefix: str, start: float, stop: float,
                   missing: list[str], timeout: float) -> list[dict[str, object]]:
        """The workers' trees of ``prefix`` over the window (the part their history
        still holds), as ``Scheduler.get_profile`` asks them, ``timeout`` at most.
        Each answer is decoded by the comm that reads it; here it is only kept
        (O(1)): the trees are merged on the export side."""
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
        done, pending = await asyncio.wait(asked, timeout=timeout)
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


def _by_prefix(groups: list[TaskGroup]) -> dict[str, list[TaskGroup]]:
    out: dict[str, list[TaskGroup]] = {}
    for tg in groups:
        out.setdefault(tg.prefix.name, []).append(tg)
    return out


def profiling_sink(scheduler: Scheduler, sink: Sink, config: PluginConfig
                   ) -> tuple[Sink, ProfileFetcher | None]:
    """The sink the forwarder sends to: ``sink`` itself, or with ``profile.enabled``
    a started :class:`ProfileFetcher` in front of it (also returned, to close)."""
    if not (config.profile_enabled and config.prefix_spans):
        return sink, None
    fetcher = ProfileFetcher(scheduler, sink, config)
    fetcher.start()
    return fetcher, fetcher

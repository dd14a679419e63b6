"""The export session: the one engine behind both transports. It takes the
forwarder's messages (:mod:`~dask_otel_spans.protocol.events`) in order on a thread of its
own, keeps the span tree copy, runs the readiness tracker every tick
and hands what is ready to the export pipeline (translation, OTel SDK).

In the scheduler process the plugin's messages reach it directly
(:class:`~dask_otel_spans.transport.thread.ThreadTransport`); in the export process, the
child's reader feeds it the frames it reads from the pipe
(:mod:`~dask_otel_spans.transport.child`).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from dask_otel_spans.background import QueueThread
from dask_otel_spans.config import TICK_INTERVAL, PluginConfig
from dask_otel_spans.export.bounded import BoundedMemory
from dask_otel_spans.export.collisions import CollisionWarnings
from dask_otel_spans.export.deltas import DeltaSums
from dask_otel_spans.export.live import LiveRecords, LiveWriter
from dask_otel_spans.export.metrics import DaskInstruments
from dask_otel_spans.export.pipeline import ExportPipeline
from dask_otel_spans.export.profiles import ProfileBook, with_profiles
from dask_otel_spans.export.share import ExportShareWatch
from dask_otel_spans.export.tracking.readiness import ReadinessTracker
from dask_otel_spans.export.tracking.records import carried_for_translation
from dask_otel_spans.export.tracking.tree import SpanTree
from dask_otel_spans.logonce import OnceLogger
from dask_otel_spans.protocol.events import Dispatcher, Message, UnknownMessage
from dask_otel_spans.protocol.exceptions import OTHER, exception_type
from dask_otel_spans.protocol.figures import ExportFigures
from dask_otel_spans.protocol.propagation import parse_carried, resolve_chain
from dask_otel_spans.protocol.tasks import SLOWEST

if TYPE_CHECKING:
    from dask_otel_spans.protocol.events import CodeSnippets
    from dask_otel_spans.protocol.snapshots import DoneFigures

logger = logging.getLogger(__name__)

#: Traces of open spans remembered at most for the exemplars of their metric points
#: (heartbeats name the spans that ran since the last one); a span's goes when it is
#: handed over
MAX_TRACES = 10_000


class ExportSession:
    """Apply the forwarder's messages to a span tree copy and its readiness tracker,
    and export what is ready through ``pipeline``.

    Parameters
    ----------
    pipeline:
        The running export pipeline (ender and metrics threads over the
        providers); the session stops it at :meth:`stop`
    config:
        The plugin's settings
    nthreads_history:
        The scheduler's ``total_nthreads_history`` when the session runs in the
        scheduler process; None keeps a copy, filled by ``history`` messages
    """

    def __init__(
        self,
        pipeline: ExportPipeline,
        config: PluginConfig,
        nthreads_history: list[tuple[float, int]] | None = None,
    ):
        self.thread = QueueThread(
            "dask-otel-spans-export-session", self._apply, what="forwarded messages",
            due=self.run_pass, due_in=self._pass_in,
        )
        self.pipeline = pipeline
        self.config = config
        self.history: list[tuple[float, int]] = (
            [] if nthreads_history is None else nthreads_history
        )
        self.tree = SpanTree(
            self.history, config.max_task_spans, config.task_spans == SLOWEST
        )
        #: the prefixes' profiles until their spans are handed over
        self.profiles = ProfileBook(config.profile_max_stacks)
        self.tracker = ReadinessTracker(
            self.tree.spans, self.tree.chain_of, config,
            n_workers=lambda: self.tree.n_workers, on_handed_over=self.tree.forget,
            held_until=self.profiles.held_until,
            recent=self.tree.recent,
        )
        #: says which blocks' tasks dask counted in another span
        self.collisions = CollisionWarnings()
        #: in the scheduler process, with providers from configuration: says once
        #: when export takes a noticeable share of the process's CPU
        self.share_watch: ExportShareWatch | None = None
        self._next_pass = time.monotonic()
        #: span id -> (contexts its records had, (trace id, span id, flags))
        self._traces: BoundedMemory[str, tuple[int, tuple[int, int, int]]] = (
            BoundedMemory(MAX_TRACES))
        self._log_once = OnceLogger(logger)
        #: messages that were not of the protocol (skipped)
        self.unreadable = 0
        #: heartbeat deltas of this pass, per span and worker-wide: they reach the
        #: tree and the metrics once per pass (:meth:`_apply_deltas`)
        self._span_deltas = DeltaSums()
        self._worker_deltas = DeltaSums()
        self._dispatch = Dispatcher(self)
        #: called with the places in the scheduler's span dict of the spans about to
        #: be handed over, before they are (the export process says them to the
        #: scheduler)
        self.before_hand_over: Callable[[list[int]], None] | None = None
        #: the records of spans while they run (export/live.py)
        self.live = LiveRecords(
            config, self.tree, self.tracker, pipeline.ender.end_many,
            LiveWriter(pipeline.providers.logger_provider,
                       pipeline.providers.tracer_provider if config.live_pending_spans
                       else None),
            pipeline.pump,
        )

    # -- the transport's side ----------------------------------------------------------

    @property
    def cpu_seconds(self) -> float:
        """CPU seconds of the session's thread so far."""
        return self.thread.cpu_seconds

    def start(self) -> None:
        self.thread.start()

    def send(self, messages: list[Message]) -> None:
        """Queue ``messages`` (in order, one queue operation); never blocks."""
        if messages:
            self.thread.put(messages)

    def flush(self, timeout: float | None = None, exporters: bool = True) -> bool:
        """Apply everything sent so far, hand over what is ready now, then (with
        ``exporters``) flush the pipeline; False when it did not finish within
        ``timeout`` seconds."""
        timeout = 10.0 if timeout is None else timeout
        deadline = time.monotonic() + timeout
        ok = self.thread.flush(timeout)
        if not exporters:
            return ok
        return self.pipeline.flush(max(0.0, deadline - time.monotonic())) and ok

    def stop(self, timeout: float = 10) -> None:
        """Apply what is queued, hand over every span still open (complete or not: the
        scheduler is closing), then stop the pipeline and its providers, waiting
        at most about ``timeout`` seconds for the exporters."""
        self.thread.stop(timeout)
        try:
            self._apply_deltas()
            self.tracker.close()
            self._hand_over()
        except Exception:
            logger.exception("dask_otel_spans: cannot hand over the spans still open")
        self.pipeline.shut_down(timeout)

    def figures(self) -> ExportFigures:
        """Figures of the tree, the tracker and the pipeline."""
        tracker, tree = self.tracker, self.tree
        waiting, waiting_on = tracker.notices.waiting_on_clients()
        return self.pipeline.figures().replace(
            open=tracker.open_count,
            waiting_on_clients=waiting, waiting_on_client=waiting_on,
            handed_over=tracker.handed_over,
            readiness_checks=tracker.readiness_checks,
            received=tree.received,
            last_position=tree.last_position,
            tree_spans=len(tree.spans),
            unreadable=self.unreadable,
            session_cpu_s=self.cpu_seconds,
        )

    # -- the thread ----------------------------------------------------------------------

    def _apply(self, messages: list[Message]) -> None:
        dispatch = self._dispatch
        for message in messages:
            try:
                dispatch(message)
            except UnknownMessage as e:
                self.unreadable += 1
                self._log_once("unknown", "skipping a message it cannot read (%s; "
                               "logged once)", e)
            except Exception:
                # (one message that fails leaves the others of its batch applied)
                self.unreadable += 1
                self._log_once(f"error:{message[0]!r:.40}", "cannot apply a %r message "
                               "(logged once per kind)", message[0], exc_info=True)
        if time.monotonic() >= self._next_pass:
            self.run_pass()
        # (else what the messages made the tracker count goes with the next pass's
        # spans: one hand-over to the pipeline's threads per pass, not per batch)

    def _pass_in(self) -> float | None:
        return max(0.0, self._next_pass - time.monotonic())

    def run_pass(self) -> None:
        """Run the tracker's pass and hand what it made ready to the pipeline."""
        self._next_pass = time.monotonic() + TICK_INTERVAL
        try:
            self._apply_deltas()
            self.tracker.run_pass()
        finally:
            self._hand_over()
        try:
            self.live.look()
        except Exception:
            self._log_once("live", "cannot make the records of running spans "
                           "(logged once)", exc_info=True)
        if self.share_watch is not None:
            self._watch_share()

    def _watch_share(self) -> None:
        assert self.share_watch is not None
        found = self.share_watch.check()
        if found is not None:
            share, window = found
            logger.info(
                "dask_otel_spans: exporting in the scheduler process took %.0f%% of "
                "its CPU over the last %.0f s (%d spans ended so far); "
                "otel-spans.export-process: auto (the default) moves that work to a "
                "child process", share * 100, window,
                self.pipeline.ender.ended_count,
            )

    def _hand_over(self) -> None:
        """Hand what the tracker made ready and counted to the pipeline: the counts
        first, so that a span's opening is counted before it ends."""
        calls, requests = self.tracker.take()
        places = self.tree.take_handed_over()
        if places and self.before_hand_over is not None:
            self.before_hand_over(places)
        if len(self.profiles):
            requests = with_profiles(requests, self.profiles)
        pump = self.pipeline.pump
        if calls and pump is not None:
            pump.submit_many(calls)
        if requests:
            traces = self._traces
            for request in requests:
                traces.pop(request.ids[-1], None)
            try:
                self.live.ended(requests)
            except Exception:
                self._log_once("live-ended", "cannot make the started records of "
                               "ended spans (logged once)", exc_info=True)
            self.pipeline.ender.end_many(requests)

    # -- the protocol's handlers ----------------------------------------------------------

    def on_span_added(self, ids: tuple[str, ...], name: tuple[str, ...],
                      enqueued: float, nthreads_offset: int, position: int) -> None:
        span = self.tree.add_span(ids, name, enqueued, nthreads_offset, position)
        if span is not None:
            self.tracker.add_span(span)
            self.live.learned(span)

    def on_group_running(self, span_id: str, group: int, prefix: str) -> None:
        self.tree.group(span_id, group, prefix)

    def on_group_done(self, span_id: str, group: int, figures: DoneFigures) -> None:
        tg = self.tree.group(span_id, group, figures[0], figures)
        if tg is not None:
            self.tracker.group_done(span_id, tg.stop)

    def on_group_counts(self, entries: list[tuple[str, int, int, int, int, int]]) -> None:
        self.tree.group_counts(entries)

    def on_group_erred(self, span_id: str, group: int, count: int,
                       classes: list[tuple[str | bytes | None, str, int]]) -> None:
        self.tree.group_erred(span_id, group, count, [
            (exception_type(name, origin) if origin is not None or name else OTHER, n)
            for origin, name, n in classes])

    def on_group_tasks(self, span_id: str, group: int, prefix: str,
                       records: list[tuple[object, ...]], erred_seen: int,
                       others_seen: int) -> None:
        self.tree.add_tasks(span_id, prefix, records, erred_seen, others_seen)

    def on_span_metrics(self, span_id: str, metrics: Mapping[Hashable, float]) -> None:
        self.tree.add_metrics(span_id, metrics)

    def on_span_code(self, span_id: str, code: CodeSnippets) -> None:
        self.tree.add_code(span_id, code)

    def on_worker_count(self, n: int) -> None:
        self.tree.n_workers = int(n)

    def on_graph_submitted(self, time: float, client: str | None, span_ids: list[str],
                 chains: object, collisions: list[tuple[str, str, str]],
                 links: list[tuple[str, dict[str, str]]]) -> None:
        self.tracker.graph(time, client, span_ids, chains, links)
        self.live.graph(span_ids)
        if collisions:
            self.collisions.seen(collisions, self.tree.tags)

    def on_carried_again(self, chains: object) -> None:
        self.tracker.carried_again(chains)

    def on_close_notice(self, time: float, msg: object) -> None:
        self.tracker.close_notice(time, msg)
        self.collisions.notice(msg)

    def on_client_gone(self, time: float, client: str) -> None:
        self.tracker.client_gone(time, client)

    def on_span_deltas(self, deltas: Mapping[Hashable, float]) -> None:
        self._span_deltas.add(deltas)

    def _apply_deltas(self) -> None:
        """The heartbeat deltas summed since the last pass, to the tree and (one
        update per key) to the metrics."""
        pump = self.pipeline.pump
        if self._span_deltas:
            deltas = self._span_deltas.take()
            self.tree.add_deltas(deltas)
            if pump is not None:
                tags = span_tags_of(deltas, self.tree.tags)
                pump.submit(DaskInstruments.add_span_deltas, deltas, tags,
                            self._traces_of(tags))
        if self._worker_deltas:
            worker_deltas = self._worker_deltas.take()
            if pump is not None:
                pump.submit(DaskInstruments.add_worker_deltas, worker_deltas)

    def _traces_of(self, span_ids: Iterable[str]) -> dict[str, tuple[int, int, int]]:
        """``(trace id, OTel span id, trace flags)`` of the open spans among
        ``span_ids``, for the exemplars of their metric points (worked out once per
        span)."""
        out = {}
        known = self._traces
        record = self.tracker.record
        for span_id in span_ids:
            rec = record(span_id)
            if rec is None:
                continue
            root = record(rec.ids[0])
            # (worked out again when the span or its root learned a context since:
            # a close notice or a later graph; what the records carry only grows)
            learned = len(rec.carried) + (len(root.carried) if root is not None else 0)
            cached = known.get(span_id)
            if cached is None or cached[0] != learned:
                carried = carried_for_translation(rec, root)
                chain = resolve_chain(rec.ids, parse_carried(carried) or {})
                cached = (learned, (chain.trace_id, chain.span_id, int(chain.trace_flags)))
                known.remember(span_id, cached)
            out[span_id] = cached[1]
        return out

    def on_worker_deltas(self, deltas: Mapping[Hashable, float]) -> None:
        self._worker_deltas.add(deltas)

    def on_profile_pending(self, span_id: str, prefix: str, wait: float) -> None:
        if self.tracker.record(span_id) is not None:
            self.profiles.pending(span_id, prefix, time.time() + wait)

    def on_profile(self, span_id: str, prefix: str, start: float, stop: float,
                   trees: list[dict[str, object]], shared_spans: int, missing: str,
                   final: bool) -> None:
        if self.tracker.record(span_id) is None:
            self._log_once("late-profile", "a profile of %r came after its span was "
                           "exported; dropped (profile.timeout; logged once)", prefix)
        elif self.profiles.add(span_id, prefix, start, stop, trees, shared_spans,
                               missing, final):
            self.tracker.look_again(span_id)

    def on_nthreads_history(self, start: int,
                            entries: Sequence[tuple[float, int]]) -> None:
        """Entries of the scheduler's ``total_nthreads_history`` from ``start`` on (a
        message sent again after a failed write changes nothing)."""
        del self.history[start:]
        self.history.extend(entries)


def span_tags_of(
    deltas: Mapping[Hashable, float], span_tags: Mapping[str, Sequence[str]]
) -> dict[str, tuple[str, ...]]:
    """The tags of the spans named in heartbeat deltas
    ``{(context, span_id, prefix, activity, unit): value}``, as a plain dict."""
    out: dict[str, tuple[str, ...]] = {}
    for key in deltas:
        if isinstance(key, tuple) and len(key) >= 4:
            span_id = key[1]
            if span_id not in out:
                try:
                    out[span_id] = tuple(span_tags[span_id])
                except (KeyError, TypeError):  # unknown: the metrics use the id
                    pass
    return out

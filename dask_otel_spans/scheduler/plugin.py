"""``OTelSpansPlugin``: the scheduler plugin that turns dask spans into OTel spans and
dask fine performance metrics into OTel metrics.

It keeps the lifecycle, the hooks and the choice of transport (the heartbeats are
tapped by :mod:`~dask_otel_spans.scheduler.heartbeats`). On the event loop the hooks
only queue what happened (O(1) each); every tick (:data:`~dask_otel_spans.config.TICK_INTERVAL`) the
:class:`~dask_otel_spans.scheduler.forwarder.SpanForwarder` sends what changed, in slices of
at most :data:`TICK_BUDGET`, through the transport (:mod:`~dask_otel_spans.transport.choice`)
to the export session, which tracks the spans' readiness and exports them, in an
export child process or on a thread.
"""
from __future__ import annotations

import asyncio
import logging
import time as _time
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from distributed.diagnostics.plugin import SchedulerPlugin
from tornado.ioloop import IOLoop, PeriodicCallback

from dask_otel_spans import names
from dask_otel_spans.client.state import ExportState
from dask_otel_spans.config import TICK_INTERVAL, PluginConfig
from dask_otel_spans.logonce import OnceLogger
from dask_otel_spans.protocol import events
from dask_otel_spans.protocol.dask_facts import SETTLED_STATES, grace_period
from dask_otel_spans.protocol.dask_private import check_private_names
from dask_otel_spans.protocol.figures import ExportFigures
from dask_otel_spans.scheduler.announce import announce, withdraw
from dask_otel_spans.scheduler.forwarder import SpanForwarder
from dask_otel_spans.scheduler.heartbeats import tap_heartbeats, worker_wide_deltas
from dask_otel_spans.scheduler.loopstats import EventLoopStats
from dask_otel_spans.scheduler.pickling import (
    Reduced,
    forget,
    reduce_plugin,
    remember,
    restore_plugin,
)
from dask_otel_spans.scheduler.profiles import ProfileFetcher, profiling_sink
from dask_otel_spans.scheduler.sampler import TaskSampler
from dask_otel_spans.transport.choice import Transport, open_transport
from dask_otel_spans.transport.spec import PipelineSpec

if TYPE_CHECKING:
    from dask.typing import Key
    from distributed import Scheduler
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider

    from dask_otel_spans.scheduler.heartbeats import SpanDeltas
    from dask_otel_spans.scheduler.sampler import TransitionKwargs

logger = logging.getLogger(__name__)

#: (``restore_plugin``: the name pickled before scheduler/pickling.py held it)
__all__ = ["OTelSpansPlugin", "restore_plugin"]

#: Longest slice of forwarding per event-loop callback, in seconds (a slice ends
#: after the step that crosses it: 256 spans, keys or task groups at most)
TICK_BUDGET = 0.001


class OTelSpansPlugin(SchedulerPlugin):
    """Export the scheduler's dask spans as OTel traces and its fine performance
    metrics as OTel metrics.

    Parameters
    ----------
    tracer_provider, meter_provider:
        Providers to use. Default: the process's global SDK providers when one is
        installed, else providers built from the standard ``OTEL_*`` variables, else
        the embedded default (OTLP-JSON lines files in ``otel-spans.output-dir``).
        Providers passed here or taken from the globals are flushed at close, never
        shut down, and keep export in the scheduler process (on a thread);
        providers built from configuration are built in the export process
        (``export-process: auto``, the default).
    environ:
        Mapping to read ``OTEL_*`` variables from; default ``os.environ``.
    use_global_providers:
        Whether to pick up the process's global SDK providers.
    **settings:
        Overrides of the ``otel-spans`` dask config, by field of
        :class:`~dask_otel_spans.config.PluginConfig` (e.g. ``export_delay=0.5``).

    Examples
    --------
    >>> client.register_plugin(OTelSpansPlugin())  # doctest: +SKIP

    or ``dask scheduler --preload dask_otel_spans``.
    """

    name = names.PLUGIN_NAME
    idempotent = False

    def __init__(
        self,
        *,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        environ: Mapping[str, str] | None = None,
        use_global_providers: bool = True,
        **settings: object,
    ):
        self.config = PluginConfig.from_dask_config(**settings)
        self._settings = settings
        self._tracer_provider = tracer_provider
        self._meter_provider = meter_provider
        self._environ = environ
        self._use_global = use_global_providers
        self._token = remember(self)

        self.scheduler: Scheduler | None = None
        #: where the forwarder's messages go (None: idle)
        self.transport: Transport | None = None
        self.forwarder: SpanForwarder | None = None
        #: what the plugin's own code costs the event loop
        self.loop_stats = EventLoopStats()
        self._spec: PipelineSpec | None = None
        #: the forwarder's ``task_moved`` while the plugin runs (the transition hook's
        #: one read), else None
        self._task_moved: Callable[[Key, str, str, TransitionKwargs], None] | None = None
        self._pc: PeriodicCallback | None = None
        self._profiles: ProfileFetcher | None = None  # (profile.enabled)
        #: the forwarding in progress, one slice at a time
        self._work: Iterator[None] | None = None
        self._closed = False
        self._started = False
        self._log_once = OnceLogger(logger)
        self._undo: list[Callable[[], None]] = []

    # -- pickling: keep providers when the scheduler is in this process -------------

    def __reduce__(self) -> Reduced:
        given = self._tracer_provider is not None or self._meter_provider is not None
        return reduce_plugin(self._token, self._settings, given, self._use_global)

    # -- figures (tests, benchmarks, run_on_scheduler) -------------------------------

    def export_figures(self) -> ExportFigures:
        """The export session's figures, by stage (as last reported when it runs in
        the export process): spans received by the session, open (not handed over
        yet), handed over (to the pipeline) and ended (in the tracer provider), and
        what came of each signal's export (:class:`ExportFigures`)."""
        return (self.transport.figures() if self.transport is not None
                else ExportFigures())

    @property
    def open_span_count(self) -> int:
        """Spans not handed over yet, those forwarded and not received yet included."""
        figures = self.export_figures()
        forwarder = self.forwarder
        if forwarder is None:
            return 0
        on_the_way = forwarder.forwarded_to_this_copy - figures.received
        return figures.open + max(0, on_the_way)

    @property
    def handed_over_count(self) -> int:
        """Spans handed over to the pipeline."""
        return self.export_figures().handed_over

    @property
    def ended_count(self) -> int:
        """Spans ended in the tracer provider."""
        return self.export_figures().ended

    @property
    def grace(self) -> float:
        """The grace period a done span waits for late heartbeats, now."""
        n = len(self.scheduler.workers) if self.scheduler is not None else 0
        return grace_period(self.config.export_delay, n)

    @property
    def destinations(self) -> dict[str, object]:
        """Where traces and metrics go, and whether an export process runs."""
        return dict(self.transport.destinations) if self.transport is not None else {}

    # -- lifecycle -------------------------------------------------------------------

    async def start(self, scheduler: Scheduler) -> None:
        if self._started:
            if scheduler is not self.scheduler:
                self._log_once(
                    "reuse", "one OTelSpansPlugin instance cannot serve two "
                    "schedulers; create one per scheduler", level=logging.ERROR,
                )
            return
        self._started = True
        self.scheduler = scheduler
        ext = scheduler.extensions.get("spans")
        if ext is None:
            self._log_once(
                "no-ext", "the scheduler has no 'spans' extension; the plugin stays "
                "idle", level=logging.WARNING,
            )
            announce(scheduler, running=self.transport is not None)
            return
        check_private_names()
        self._spec = PipelineSpec(
            self.config,
            dict(self._environ) if self._environ is not None else None,
            scheduler.address,
            self.config.providers,
        )
        previous = scheduler.plugins.get(self.name)
        if not isinstance(previous, OTelSpansPlugin) or previous is self:
            previous = None
        self.transport = transport = await self._transport(scheduler, previous)
        if transport is None:
            if previous is not None:
                await previous.close()
            announce(scheduler, running=self.transport is not None)
            return
        sink, self._profiles = profiling_sink(scheduler, transport, self.config)
        self.forwarder = forwarder = SpanForwarder(
            ext.spans, scheduler.tasks, sink, self.config.include_code,
            TaskSampler(self.config.task_spans, self.config.max_task_spans),
            getattr(ext, "spans_search_by_name", None),
            live_interval=self.config.live_interval,
        )
        self._task_moved = forwarder.task_moved
        if previous is not None and previous.transport is self.transport:
            # the same export session carries on: the forwarding goes on from
            # where the previous instance was
            previous._forward_all()
            if previous.forwarder is not None:
                forwarder.take_over(previous.forwarder)
            previous.transport = None
            logger.info("dask_otel_spans: carrying on from the plugin registered "
                        "before, with the same settings")
        else:
            # spans from before the plugin: forwarded first, in slices
            self._work = forwarder.adopt()
            IOLoop.current().add_callback(self._run_slice)
        if previous is not None:
            await previous.close()  # (it withdraws what it announced: after it)
        announce(scheduler, running=self.transport is not None)
        self._undo.extend(tap_heartbeats(
            ext, scheduler, self._on_span_deltas, self._on_worker_heartbeat))
        self._pc = PeriodicCallback(self._tick, TICK_INTERVAL * 1000)
        scheduler.periodic_callbacks[f"{self.name}-tick"] = self._pc
        self._pc.start()

    async def _transport(self, scheduler: Scheduler,
                         previous: OTelSpansPlugin | None) -> Transport | None:
        """The transport of the plugin registered before, when it hands over to this
        one (same settings), else a new one (its destinations logged at INFO); None
        when no exporter could be set up."""
        if previous is not None and previous._hands_over_to(self):
            return previous.transport
        assert self._spec is not None
        history = getattr(scheduler, "total_nthreads_history", None)
        transport = await open_transport(
            self._spec, tracer_provider=self._tracer_provider,
            meter_provider=self._meter_provider, use_global=self._use_global,
            nthreads_history=history if isinstance(history, list) else None,
        )
        if transport is not None:
            destinations = transport.destinations
            logger.info(
                "dask_otel_spans: traces to %s; metrics to %s; erred tasks' "
                "exceptions: %s; %s",
                destinations.get("traces_to"), destinations.get("metrics_to"),
                destinations.get("exceptions_to", "span events"),
                f"export process pid {destinations.get('pid')}"
                if destinations.get("export_process")
                else "exporting on a thread of the scheduler process",
            )
        return transport

    def _hands_over_to(self, successor: OTelSpansPlugin) -> bool:
        """Whether ``successor`` (registered after this instance) may keep this
        instance's export session: the same settings and providers."""
        return (
            self.transport is not None
            and not self._closed
            and self._spec == successor._spec
            and self._tracer_provider is successor._tracer_provider
            and self._meter_provider is successor._meter_provider
            and self._use_global == successor._use_global
        )

    async def close(self, **kwargs: object) -> None:
        if self._closed:
            return
        self._closed = True
        self._task_moved = None
        if self._profiles is not None:
            self._profiles.close()
        if self._pc is not None:
            self._pc.stop()
            if self.scheduler is not None:
                self.scheduler.periodic_callbacks.pop(f"{self.name}-tick", None)
        with self._guard("close"):
            # (the export session hands over what is open when it stops)
            self._forward_all()
            if self.forwarder is not None:
                self.forwarder.forward_tasks_left()
        for undo in reversed(self._undo):
            try:
                undo()
            except Exception:
                self._log_failure("unwrap")
        self._undo.clear()
        transport, self.transport = self.transport, None
        if transport is not None:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, transport.stop, self.config.shutdown_timeout)
        forget(self._token)
        if self.scheduler is not None and self.scheduler.plugins.get(self.name) in (
                None, self):
            withdraw(self.scheduler)

    async def export_state(self, flush: bool = False, exporters: bool = True,
                           client: str | None = None) -> ExportState:
        """Where data goes and how far export got, as a client's
        :func:`~dask_otel_spans.client.wait_for_export` reads it (``flush``: forward
        what happened so far, let the session hand over what is ready, and with
        ``exporters`` flush the exporters, first). ``client``: the id of the client
        that asks; the spans that wait for other clients alone (their close notices
        opened them and the scheduler saw no task of them) are not open for it."""
        idle = self.transport is None
        flushed = (await self.flush(exporters=exporters) and not idle) if flush else None
        figures = self.export_figures()
        not_for_it = figures.open - figures.open_for(client)
        return ExportState.from_figures(
            figures, self.destinations, open=max(0, self.open_span_count - not_for_it),
            handed_over=self.handed_over_count, flushed=flushed)

    async def flush(self, timeout: float = 10.0, exporters: bool = True) -> bool:
        """Forward what happened so far, let the export session hand over what is ready
        now, then (``exporters``) flush the exporters; False when it did not finish in
        time."""
        transport = self.transport
        if transport is None:
            return True
        if not self._closed:
            with self._guard("flush"):
                self._forward_all()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, transport.flush, timeout, exporters)

    # -- the heartbeats' deltas (scheduler/heartbeats.py taps them) -----------------

    def _on_span_deltas(self, data: SpanDeltas) -> None:
        forwarder = self.forwarder
        if not self._closed and forwarder is not None:
            with self._guard("heartbeat"):
                forwarder.forward_deltas(data)

    def _on_worker_heartbeat(self, result: object, metrics: object) -> None:
        transport = self.transport
        if not self._closed and transport is not None:
            with self._guard("worker-heartbeat"):
                deltas = worker_wide_deltas(result, metrics)
                if deltas:
                    transport.send([events.worker_deltas(deltas)])

    # -- hooks: O(1) each; the forwarder sends what they queued at the next tick -----
    # (not timed: the clock reads would cost more than the work)

    def update_graph(self, scheduler: Scheduler, *, tasks: Collection[Key] = (),
                     annotations: Mapping[str, Mapping[Key, Any]] | None = None,
                     client: str | None = None, **kwargs: object) -> None:
        forwarder = self.forwarder
        if forwarder is None or self._closed:
            return
        try:
            forwarder.graph_submitted(client, tasks, annotations)
        except Exception:
            self._log_failure("update_graph")

    def log_event(self, topic: str, msg: object, **kwargs: object) -> None:
        forwarder = self.forwarder
        if topic != names.EVENT_TOPIC or forwarder is None or self._closed:
            return
        forwarder.close_notice(msg)

    def remove_client(self, scheduler: Scheduler, client: str, **kwargs: object) -> None:
        forwarder = self.forwarder
        if forwarder is None or self._closed:
            return
        forwarder.client_gone(client)

    def transition(self, key: Key, start: str, finish: str, *args: object,
                   **kwargs: Any) -> None:
        # Called for every transition of every task: only a task that settles or
        # starts (again) goes to the forwarder (its group is noted, once per tick).
        # From one settled state to another (memory -> released -> forgotten) its
        # group's ``done`` cannot change.
        if (finish in SETTLED_STATES) is (start in SETTLED_STATES):
            return
        task_moved = self._task_moved
        if task_moved is None:  # (not started, or closed)
            return
        try:
            task_moved(key, start, finish, kwargs)
        except Exception:
            self._log_failure("transition")

    # -- the tick --------------------------------------------------------------------

    def _tick(self) -> None:
        forwarder, transport, scheduler = self.forwarder, self.transport, self.scheduler
        if (self._closed or self._work is not None or forwarder is None
                or transport is None or scheduler is None):
            return
        try:
            if self._unregistered(scheduler):
                return
            handed_over = transport.restarted()
            n_workers = len(scheduler.workers)
            if handed_over is None and forwarder.idle(n_workers):
                return  # (nothing came since the last tick: no clock read, no work)
        except Exception:
            self._log_failure("tick")
            return
        with self._guard("tick"):
            if handed_over is not None:
                # a new export process (the previous one died): it knows no span,
                # and what the old one had not handed over is lost with it
                self._work = forwarder.adopt(handed_over)
            else:
                self._work = forwarder.tick_steps(n_workers)
        self._run_slice()

    def _unregistered(self, scheduler: Scheduler) -> bool:
        """Whether the scheduler no longer has this plugin; then it closes itself
        (its open spans exported, as at the scheduler's close). The client's
        ``unregister_scheduler_plugin`` removes a plugin without closing it, which
        would leave its tick, its heartbeat taps and its export process running.
        O(plugins), a handful."""
        for plugin in scheduler.plugins.values():
            if plugin is self:
                return False
        if self._pc is not None:
            self._pc.stop()
        logger.info("dask_otel_spans: the plugin was unregistered; closing it (what "
                    "it holds is exported, spans still open as incomplete)")
        IOLoop.current().add_callback(self.close)
        return True

    def _run_slice(self) -> None:
        """Run the forwarding in progress for at most :data:`TICK_BUDGET`; the rest goes
        to a new event-loop callback."""
        work = self._work
        if work is None:
            return
        if self._closed:
            self._work = None
            return
        more = False
        with self._guard("tick"):
            deadline = _time.perf_counter() + TICK_BUDGET
            try:
                for _ in work:
                    if _time.perf_counter() > deadline:
                        more = True
                        break
            except BaseException:
                self._work = None
                raise
        if more:
            IOLoop.current().add_callback(self._run_slice)
        else:
            self._work = None

    def _forward_all(self) -> None:
        """Forward everything now, an adoption in progress included (close, flush,
        hand-over)."""
        forwarder, scheduler = self.forwarder, self.scheduler
        if forwarder is None or self.transport is None or scheduler is None:
            return
        try:
            for _ in self._work or ():
                pass
        finally:
            self._work = None
        forwarder.tick(len(scheduler.workers))

    # -- helpers ---------------------------------------------------------------------

    @contextmanager
    def _guard(self, where: str) -> Iterator[None]:
        """Never let an exception escape into the scheduler; log once per place;
        account the time spent on the event loop."""
        with self.loop_stats.timed(where):
            try:
                yield
            except Exception:
                self._log_failure(where)

    def _log_failure(self, where: str) -> None:
        self._log_once.failure(where)

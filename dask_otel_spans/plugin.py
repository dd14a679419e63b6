"""``OTelSpansPlugin``: the scheduler plugin that turns dask spans into OTel spans and
dask fine performance metrics into OTel metrics.

The scheduler's ``SpansSchedulerExtension`` stays the authoritative span tree; the
plugin keeps a small record per span that is still open (not emitted yet) and nothing
for the spans it already emitted, so its memory follows the open spans, not history.

On the event loop the hooks only queue what happened (O(1) each); a periodic pass,
cut in slices of at most ``tick-budget``, registers new spans, applies annotations,
looks again at the spans that changed (or whose wait ran out), decides which are
ready and copies them (:mod:`~dask_otel_spans.snapshot`): a pass costs what changed
since the last one, not the number of open spans.
Translation and the OTel SDK run in a child process of the scheduler
(:mod:`~dask_otel_spans.export_process`) when the providers are built from
configuration (``otel-spans.export-process: auto``, the default); otherwise on the
:class:`~dask_otel_spans.emitter.SpanEmitter` thread, and metric updates on the
:class:`~dask_otel_spans.metrics.MetricsPump` thread, of the scheduler process
(:mod:`~dask_otel_spans.pipeline`).
"""
from __future__ import annotations

import asyncio
import functools
import heapq
import logging
import math
import os
import time as _time
import uuid
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from itertools import islice, repeat
from typing import TYPE_CHECKING, Any

from distributed.diagnostics.plugin import SchedulerPlugin
from distributed.metrics import time
from distributed.scheduler import heartbeat_interval
from tornado.ioloop import IOLoop, PeriodicCallback

from dask_otel_spans import names
from dask_otel_spans.config import PluginConfig
from dask_otel_spans.emitter import SpanEmitter
from dask_otel_spans.export_process import ExportProcess, ExportProcessError
from dask_otel_spans.export_share import ExportShareWatch
from dask_otel_spans.forwarding import (
    CLIENT_GONE,
    GRAPH,
    NOTICE,
    RUNNING_STATES,
    SETTLED_STATES,
    SpanForwarder,
    chain_ids,
    collect_span_ids,
    group_done,
)
from dask_otel_spans.metrics import DaskInstruments, MetricsPump
from dask_otel_spans.pipeline import ExportPipeline, PipelineSpec
from dask_otel_spans.propagation import carried_headers
from dask_otel_spans.providers import (
    Providers,
    global_sdk_meter_provider,
    global_sdk_tracer_provider,
    exporter_names,
)
from dask_otel_spans.snapshot import (
    CHILDREN_PER_STEP,
    MIRRORED_HISTORY,
    iter_snapshot_span,
    snapshot_in_one_step,
)

if TYPE_CHECKING:
    from distributed import Scheduler
    from distributed.spans import Span, SpansSchedulerExtension

logger = logging.getLogger(__name__)

#: Plugins created in this process, so that one registered through
#: ``client.register_plugin`` on an in-process scheduler keeps its providers
_LOCAL_PLUGINS: weakref.WeakValueDictionary[str, OTelSpansPlugin] = (
    weakref.WeakValueDictionary()
)
#: Ids remembered in the bounded id sets (spans emitted with no scheduler-side Span,
#: against duplicates; ids carried by graphs before the plugin knew the span)
_MAX_REMEMBERED = 10_000
#: Longest wait for the providers' flush and shutdown at scheduler close
_CLOSE_TIMEOUT = 10.0
#: Items of work between two looks at the clock in a slice of the pass
_CHECK_EVERY = 32
#: Readiness checks between two looks at the clock: a check of a span whose tree is
#: still running costs up to ~75 µs (it may walk its open children once per pass)
_CHECKS_PER_STEP = 8
#: What a check that emits its span counts for against ``_CHECKS_PER_STEP`` (the copy
#: and the request of a span of few task groups cost about two checks)
_EMISSION_WEIGHT = 3
#: Close notices handled between two looks at the clock (~10 µs each)
_NOTICES_PER_STEP = 4
#: Verdicts (done, finished at) a step of the pass may work out, ~1-2 µs each: the
#: check of a span with a large open tree walks it in several steps
_VERDICTS_PER_STEP = 128
#: Task groups looked at per verdict counted (a group's ``done`` reads its states)
_GROUPS_PER_VERDICT = 8

#: Kinds of queued hook events; and a graph given as the ids of its tasks' spans (as
#: the export process's copy of the span tree has it)
_GRAPH, _NOTICE, _CLIENT_GONE = GRAPH, NOTICE, CLIENT_GONE
_SPANS_GRAPH = "graph-spans"

#: Task states a transition can leave a TaskGroup done in, and the others
_SETTLED_STATES, _RUNNING_STATES = SETTLED_STATES, RUNNING_STATES
#: ``TaskGroup.done`` from the group's state counts
_group_done = group_done


class _OutOfStep(Exception):
    """A verdict needs more work than this step has left: the walk so far is kept,
    and the next step goes on with it."""


class _OpenSpan:
    """Bookkeeping of one dask span that was not emitted yet."""

    __slots__ = (
        "id",
        "tags",
        "ids",
        "span",
        "carried",
        "helper",
        "closed_at",
        "close_reason",
        "last_activity",
        "done_since",
        "finished_at",
        "clients",
        "client_gone",
        "enter",
        "exit",
        "counted",
        "depth",
        "submitted",
        "awaiting_graph",
        "open_children",
        "children_finished_at",
        "wake_at",
        "unfinished_group",
        "unfinished_child",
    )

    def __init__(self, dask_id: str, tags: tuple[str, ...], ids: tuple[str, ...]):
        self.id = dask_id
        self.tags = tags
        #: chain of dask span ids, root first
        self.ids = ids
        #: the scheduler's Span; None until it has tasks
        self.span: Span | None = None
        #: W3C headers carried from the client for ids of the chain, as sent
        #: (parsed where the span is translated, not on the event loop)
        self.carried: dict[str, Any] = {}
        #: opened by the client helper: wait for its close notice
        self.helper = False
        self.closed_at: float | None = None
        self.close_reason = names.CLOSE_REASON_IDLE
        self.last_activity = 0.0
        self.done_since: float | None = None
        #: when the last task of its tree finished, as worked out when it was judged
        #: done (valid while ``done_since`` is set: emitting it needs it again)
        self.finished_at = 0.0
        self.clients: set[str] = set()
        self.client_gone = False
        #: client-side enter/exit times (from the close notice)
        self.enter: float | None = None
        self.exit: float | None = None
        #: counted in dask.span.active
        self.counted = False
        self.depth = len(ids)
        #: a graph carrying its annotation reached the scheduler (its tasks may sit
        #: in another span's TaskGroup: distributed's TaskGroup collision)
        self.submitted = False
        #: closed before the scheduler saw it, and the client said collections
        #: built in the block are still to be computed: their graph will bring it
        self.awaiting_graph = False
        #: registered children not emitted yet (so that a pass looks at the open
        #: children only, never at every child the span ever had)
        self.open_children: set[str] = set()
        #: when the last task of the emitted children finished
        self.children_finished_at = 0.0
        #: when a pass looks at it again, unless something changes first
        self.wake_at: float | None = None
        #: a TaskGroup of the span found not done by the last check: looked at
        #: first, so that checking a running span of many groups is O(1)
        self.unfinished_group: Any = None
        #: id of an open child found not done (or closed, and so emitted before
        #: it) by the last check: looked at first, so that checking a span of many
        #: running or waiting children is O(depth)
        self.unfinished_child: str | None = None


class _SpanTags(Mapping):
    """Span id -> tags, read by the metrics thread from the extension's span dict
    (which never forgets a span; dict lookups are atomic and a Span's name never
    changes), so that the event loop does not walk heartbeat keys."""

    __slots__ = ("_spans",)

    def __init__(self, spans: Mapping[str, Span]):
        self._spans = spans

    def __getitem__(self, span_id: str) -> tuple[str, ...]:
        return tuple(self._spans[span_id].name)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._spans))

    def __len__(self) -> int:
        return len(self._spans)


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
        shut down, and keep export in the scheduler process; providers built from
        configuration are built in the export process (``export_process="auto"``, the
        default; ``False`` builds them here).
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
        tracer_provider: Any = None,
        meter_provider: Any = None,
        environ: Mapping[str, str] | None = None,
        use_global_providers: bool = True,
        **settings: Any,
    ):
        self.config = PluginConfig.from_dask_config(**settings)
        self._settings = settings
        self._explicit_tracer_provider = tracer_provider
        self._explicit_meter_provider = meter_provider
        self._environ = environ
        self._use_global = use_global_providers
        self._token = uuid.uuid4().hex
        _LOCAL_PLUGINS[self._token] = self

        self.scheduler: Scheduler | None = None
        self._ext: SpansSchedulerExtension | None = None
        self._span_tags: _SpanTags | None = None
        self.providers: Providers | None = None
        self.pipeline: ExportPipeline | None = None
        #: the child process that exports (``export-process``: auto or true)
        self.export_process: ExportProcess | None = None
        #: where spans go: the pipeline's emitter, or the export process
        self.emitter: SpanEmitter | ExportProcess | None = None
        self.instruments: DaskInstruments | None = None
        #: where metric updates go: the pipeline's pump, or the export process
        self.pump: MetricsPump | ExportProcess | None = None
        #: in process, with providers from configuration: the share of the scheduler
        #: process's CPU that export takes, to say once when the export process helps
        self.export_share_watch: ExportShareWatch | None = None
        self._pc: PeriodicCallback | None = None
        self._closed = False
        self._started = False
        #: with the export process (``track-in-export-process``): what forwards the
        #: span events there; the state machine below then runs in that process
        self._forwarder: SpanForwarder | None = None
        #: the export process's launches that the forwarder re-sent the spans to
        self._launches_seen = 0

        self._open: dict[str, _OpenSpan] = {}
        #: emitted spans whose parent is still open: the emitter holds their summary
        self._summarized: set[str] = set()
        #: spans of ext.spans (in insertion order) registered or looked at so far
        self._n_known = 0
        self._unseen_emitted: OrderedDict[str, None] = OrderedDict()
        #: ids carried by graphs before the plugin knew the span (bounded)
        self._submitted_unknown: OrderedDict[str, None] = OrderedDict()
        #: hook events not processed yet: (kind, len(ext.spans) then, time, *details)
        self._pending: deque[tuple[Any, ...]] = deque()
        #: what snapshots carry for the scheduler's total_nthreads_history: None (a
        #: reference to it), or MIRRORED_HISTORY (the export process has a copy)
        self._snapshot_history: tuple[tuple[float, int], ...] | None = None
        #: what the pass emitted and counted, handed over at the end of each slice
        #: in one queue operation each (not one per span); requests in their
        #: plain form (see EmitRequest)
        self._emitted: list[tuple[Any, ...]] = []
        self._metric_calls: list[tuple[str, tuple[Any, ...]]] = []
        #: spans that existed when the plugin started, still to be looked at
        self._adopting: Iterator[Span] | None = None
        #: the pass in progress, one slice at a time
        self._work: Iterator[None] | None = None
        #: this pass's verdicts per open span id: done, and when its tree finished;
        #: events taken in during the pass forget those of the spans they touch
        self._pass_done: dict[str, bool] = {}
        self._pass_finished: dict[str, float] = {}
        #: walks of open children cut at the end of a step, to go on with: span id
        #: -> children left, and (finished at) the latest stop found so far
        self._done_walks: dict[str, list[str]] = {}
        self._finished_walks: dict[str, tuple[float, list[str]]] = {}
        #: own task groups left to look at, of a span with many
        self._group_walks: dict[str, list[Any]] = {}
        #: verdicts worked out (not reused) in this step of the pass, and how many
        #: a step may work out (no limit outside the pass: close, hand-over)
        self._verdicts_in_step = 0
        self._verdict_limit: float = math.inf
        #: open spans to look at in the next pass, deepest first: heap of
        #: (-depth, id), and the ids in it
        self._to_check: list[tuple[int, str]] = []
        self._queued: set[str] = set()
        #: when open spans waiting for a grace period or a timeout are due:
        #: heap of (time, id)
        self._wakeups: list[tuple[float, str]] = []
        #: spans closed before the scheduler saw them, waiting for their graph:
        #: id -> when lazy-timeout runs out, in that order; apart from the heap so
        #: that the graph (which comes, in most cases) drops the wait, and no
        #: long-stale wake-up outlives the span
        self._awaiting_graph: OrderedDict[str, float] = OrderedDict()
        #: the latest time put in ``_awaiting_graph`` since it was last empty: at
        #: or after every time in it (one taken out may have been that latest)
        self._awaiting_until = -math.inf
        #: span ids of TaskGroups whose tasks settled since the last pass (the
        #: ``transition`` hook)
        self._settled: set[str] = set()
        self._tasks: Mapping[Any, Any] | None = None
        self._logged: set[str] = set()
        self._undo: list[Any] = []
        #: figures for tests and benchmarks
        #: spans handed to the emitter
        self._handed_over = 0
        #: the export process's count when ``handed_over_count`` was last set
        self._handed_over_offset = 0
        #: readiness checks made by the passes (one per changed or due open span)
        self.readiness_checks = 0
        self.max_call_seconds = 0.0
        self.total_call_seconds = 0.0
        self.max_call_by_hook: dict[str, float] = {}
        #: longest call in CPU time of the event-loop thread (wall time less waits
        #: for the GIL and the OS)
        self.max_call_cpu_seconds = 0.0
        self.total_call_cpu_seconds = 0.0
        #: cumulative seconds the calling thread spent paused (e.g. in garbage
        #: collection), when a benchmark provides it: longest call CPU without them
        self.pause_clock: Callable[[], float] | None = None
        self.max_call_cpu_less_pauses_seconds = 0.0
        self.max_call_cpu_less_pauses_by_hook: dict[str, float] = {}

    # -- pickling: keep providers when the scheduler is in this process -------------

    def __reduce__(self) -> tuple[Any, ...]:
        had_providers = (
            self._explicit_tracer_provider is not None
            or self._explicit_meter_provider is not None
        )
        return (
            _restore_plugin,
            (self._token, dict(self._settings), had_providers, self._use_global),
        )

    # -- helpers ---------------------------------------------------------------------

    def _log_once(self, kind: str, msg: str, *args: Any, level: int = logging.WARNING,
                  exc_info: bool = False) -> None:
        if kind in self._logged:
            return
        self._logged.add(kind)
        logger.log(level, "dask_otel_spans: " + msg, *args, exc_info=exc_info)

    @contextmanager
    def _guard(self, where: str) -> Iterator[None]:
        """Never let an exception escape into the scheduler; log once per place;
        account the time spent on the event loop."""
        pause_clock = self.pause_clock
        paused0 = pause_clock() if pause_clock is not None else 0.0
        t0 = _time.perf_counter()
        cpu0 = _time.thread_time()
        try:
            yield
        except Exception:
            self._log_failure(where)
        finally:
            elapsed = _time.perf_counter() - t0
            cpu = _time.thread_time() - cpu0
            self.total_call_seconds += elapsed
            self.total_call_cpu_seconds += cpu
            if elapsed > self.max_call_seconds:
                self.max_call_seconds = elapsed
            if elapsed > self.max_call_by_hook.get(where, 0.0):
                self.max_call_by_hook[where] = elapsed
            if pause_clock is not None:
                own = max(0.0, cpu - (pause_clock() - paused0))
                if own > self.max_call_cpu_less_pauses_seconds:
                    self.max_call_cpu_less_pauses_seconds = own
                by_hook = self.max_call_cpu_less_pauses_by_hook
                if own > by_hook.get(where, 0.0):
                    by_hook[where] = own
            if cpu > self.max_call_cpu_seconds:
                self.max_call_cpu_seconds = cpu

    @contextmanager
    def _contain(self, where: str) -> Iterator[None]:
        """Log (once per place) and swallow an exception of one item of work."""
        try:
            yield
        except Exception:
            self._log_failure(where)

    def _log_failure(self, where: str) -> None:
        """Log (once per place) the exception being handled."""
        self._log_once(
            f"error:{where}", "unexpected error in %s (logged once)", where,
            level=logging.ERROR, exc_info=True,
        )

    @property
    def grace(self) -> float:
        """Effective grace period: at least two worker heartbeat intervals."""
        n = len(self.scheduler.workers) if self.scheduler is not None else 0
        return max(self.config.export_delay, 2 * heartbeat_interval(n))

    @property
    def open_span_count(self) -> int:
        """Spans not emitted yet (as the export process last reported, when it
        tracks them)."""
        forwarder, process = self._forwarder, self.export_process
        if forwarder is not None and process is not None:
            # (and those forwarded to it that it has not reported yet)
            to_it = forwarder.forwarded_spans - forwarder.forwarded_before_adoption
            on_the_way = to_it - int(process.child_stats.get("received", 0))
            return int(process.child_stats.get("open", 0)) + max(0, on_the_way)
        return len(self._open)

    @property
    def handed_over_count(self) -> int:
        """Spans handed to the emitter (by the export process, as it last reported,
        when it tracks them)."""
        return self._handed_over + self._child_handed_over() - self._handed_over_offset

    @handed_over_count.setter
    def handed_over_count(self, value: int) -> None:
        self._handed_over = value
        self._handed_over_offset = self._child_handed_over()

    def _child_handed_over(self) -> int:
        if self._forwarder is None or self.export_process is None:
            return 0
        return self.export_process.child_total("handed_over")

    @property
    def tracks_in_export_process(self) -> bool:
        """Whether the export process tracks the spans (this plugin forwards what
        happens to them)."""
        return self._forwarder is not None

    @property
    def emitted_count(self) -> int:
        """Spans that reached the tracer provider (ended there)."""
        return self.emitter.exported_count if self.emitter is not None else 0

    @property
    def pending_event_count(self) -> int:
        return len(self._pending)

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
            return
        spec = PipelineSpec(
            self.config,
            dict(self._environ) if self._environ is not None else None,
            scheduler.address,
            self.config.providers,
        )
        if self._may_export_in_child():
            kept = self._export_process_to_keep(scheduler, spec)
            if kept is not None:
                self._export_to(kept)
                logger.info(
                    "dask_otel_spans: export process pid %s carries on from the plugin "
                    "registered before, with the same settings", kept.pid,
                )
            else:
                await self._start_export_process(spec)
        if self.export_process is None:
            try:
                self.providers = spec.resolve_providers(
                    tracer_provider=self._explicit_tracer_provider,
                    meter_provider=self._explicit_meter_provider,
                    use_global=self._use_global,
                )
                self.pipeline = ExportPipeline.build(self.providers, self.config)
            except Exception as e:
                self._log_once(
                    "providers", "cannot set up exporters (%s); the plugin stays idle",
                    e, level=logging.ERROR,
                )
                return
            self.emitter = self.pipeline.emitter
            self.pump = self.pipeline.pump
            self.instruments = self.pipeline.instruments
            if (
                self.config.export_process is False
                and self._why_export_stays_here() is None
            ):
                self.export_share_watch = ExportShareWatch(self.pipeline.cpu_seconds)
            logger.info(
                "dask_otel_spans: traces to %s; metrics to %s",
                self.providers.traces_to,
                self.providers.metrics_to,
            )
        self._ext = ext
        self._tasks = scheduler.tasks
        self._span_tags = _SpanTags(ext.spans)
        if self.export_process is not None and self.config.track_in_export_process:
            if self.config.include_code:
                logger.info(
                    "dask_otel_spans: include-code: spans are tracked in the scheduler "
                    "process (their code is there)"
                )
            else:
                self._forwarder = SpanForwarder(
                    ext.spans, scheduler.tasks, self.export_process, _RUNNING_STATES
                )
                self._launches_seen = self.export_process.launches

        previous = scheduler.plugins.get(self.name)
        if isinstance(previous, OTelSpansPlugin) and previous is not self:
            await self._take_over(previous)
        elif self._forwarder is not None:
            # spans from before the plugin: forwarded first, in slices
            self._adopt()
        else:
            # Spans from before the plugin: looked at in the first passes, in slices
            self._adopting = iter(list(ext.spans.values()))
            self._n_known = len(ext.spans)

        self._wrap_heartbeats()
        self._pc = PeriodicCallback(self._tick, self.config.tick_interval * 1000)
        scheduler.periodic_callbacks[f"{self.name}-tick"] = self._pc
        self._pc.start()

    def _may_export_in_child(self) -> bool:
        """Whether to export in the export process: asked for (``true``, or ``auto``,
        the default) and possible. Says once why not when it was asked for
        explicitly (at DEBUG under ``auto``)."""
        setting = self.config.export_process
        if setting is False:
            return False
        where = self._why_export_stays_here()
        if where is None:
            return True
        self._log_once(
            "export-process-providers", "the export process needs providers built "
            "from configuration (OTEL_* or otel-spans.providers); with %s, spans are "
            "exported in the scheduler process", where,
            level=logging.INFO if setting is True else logging.DEBUG,
        )
        return False

    def _why_export_stays_here(self) -> str | None:
        """What keeps export in the scheduler process whatever ``export-process``
        says: providers that are objects of this process (given, or the global
        ones), or Prometheus on the scheduler's own port; None when nothing does."""
        if self._explicit_tracer_provider is not None or (
            self._explicit_meter_provider is not None
        ):
            return "given providers"
        if self.config.providers:
            return None
        if self._prometheus_on_scheduler_port():
            return ("OTEL_METRICS_EXPORTER=prometheus on the scheduler's own /metrics "
                    "(set OTEL_EXPORTER_PROMETHEUS_PORT to serve from the export process)")
        if self._use_global and (
            global_sdk_tracer_provider() is not None
            or global_sdk_meter_provider() is not None
        ):
            return "the process's global providers"
        return None

    def _prometheus_on_scheduler_port(self) -> bool:
        """Whether metrics go to the scheduler's own ``/metrics`` (the registry of
        this process, which an export process could not fill)."""
        environ = os.environ if self._environ is None else self._environ
        return "prometheus" in exporter_names(environ, "OTEL_METRICS_EXPORTER") and (
            not environ.get("OTEL_EXPORTER_PROMETHEUS_PORT")
        )

    def _export_process_to_keep(
        self, scheduler: Scheduler, spec: PipelineSpec
    ) -> ExportProcess | None:
        """The export process of the instance this one takes over from, when it was
        built from the same settings: its providers, counters and the subtree
        summaries of spans already emitted then carry on (a new child would start
        them from nothing)."""
        previous = scheduler.plugins.get(self.name)
        if not isinstance(previous, OTelSpansPlugin) or previous is self:
            return None
        process = previous.export_process
        if process is None or previous._closed or process.spec != spec:
            return None
        return process

    async def _start_export_process(self, spec: PipelineSpec) -> None:
        """Start the export process; on failure the scheduler process exports."""
        process = ExportProcess(
            spec, max_metric_backlog=self.config.max_queue_size,
            nice=self.config.export_process_nice,
            cpu_policy=self.config.export_process_cpu_policy,
        )
        loop = asyncio.get_running_loop()
        try:
            info = await loop.run_in_executor(None, process.launch)
        except ExportProcessError as e:
            self._log_once(
                "export-process-start", "the export process did not start (%s); "
                "exporting in the scheduler process", e,
                level=logging.ERROR if self.config.export_process is True
                else logging.WARNING,
            )
            return
        process.start()
        self._export_to(process)
        logger.info(
            "dask_otel_spans: export process pid %s: traces to %s; metrics to %s",
            info.get("pid"), info.get("traces_to"), info.get("metrics_to"),
        )

    def _export_to(self, process: ExportProcess) -> None:
        """Send spans and metric updates to ``process``; it keeps a copy of the
        scheduler's ``total_nthreads_history``, which the snapshots then need not
        carry."""
        self.export_process = self.emitter = self.pump = process
        history = getattr(self.scheduler, "total_nthreads_history", None)
        if isinstance(history, list):
            process.nthreads_history = history
            self._snapshot_history = MIRRORED_HISTORY

    async def _take_over(self, previous: OTelSpansPlugin) -> None:
        """Registered again (same name): continue where the previous instance was,
        so that no span is lost or emitted twice."""
        if previous._forwarder is not None or self._forwarder is not None:
            await self._take_over_forwarding(previous)
            return
        for name, value in previous._hand_over().items():
            setattr(self, name, value)
        process = self.export_process
        kept = process is not None and previous.export_process is process
        if kept:
            # it carries on for this instance: the previous one must not stop it
            previous.export_process = previous.emitter = previous.pump = None
        for rec in self._open.values():
            if rec.counted and self.pump is not None and not kept:
                # a new pipeline counts the open spans from zero
                self.pump.submit("span_opened", rec.tags)
            # the previous instance's wake-ups are gone: look at every span once
            rec.wake_at = None
            self._look_again(rec)
        await previous.close()
        if previous.emitter is not None and self.emitter is not None:
            # previous.close() drained its emitter: its summaries are final
            self.emitter.summaries.update(previous.emitter.summaries)

    async def _take_over_forwarding(self, previous: OTelSpansPlugin) -> None:
        """:meth:`_take_over` where either instance forwards to the export process.
        With the same export process kept, the forwarding goes on from where the
        previous instance was. Otherwise the spans still running are taken up as at
        start; the previous instance ends its own (as incomplete spans)."""
        process = self.export_process
        kept = process is not None and previous.export_process is process
        if kept and previous._forwarder is not None and self._forwarder is not None:
            previous._forward_all()
            self._forwarder.n_known = previous._forwarder.n_known
            self._forwarder.touched = previous._forwarder.touched
            self._forwarder.running_forwarded = previous._forwarder.running_forwarded
            self._forwarder.workers = previous._forwarder.workers
            self._forwarder.forwarded_spans = previous._forwarder.forwarded_spans
            self._forwarder.forwarded_before_adoption = (
                previous._forwarder.forwarded_before_adoption
            )
            previous._forwarder = None
        elif self._forwarder is not None:
            self._adopt()
        else:
            self._adopting = iter(list(self._ext.spans.values()))
            self._n_known = len(self._ext.spans)
        if kept:
            # it carries on for this instance: the previous one must not stop it
            previous.export_process = previous.emitter = previous.pump = None
        await previous.close()

    def _hand_over(self) -> dict[str, Any]:
        """The bookkeeping, after processing every queued event; this instance keeps
        nothing to emit at its close."""
        self._finish_work()
        state = {
            "_open": self._open,
            "_summarized": self._summarized,
            "_n_known": self._n_known,
            "_unseen_emitted": self._unseen_emitted,
            "_submitted_unknown": self._submitted_unknown,
        }
        self._open, self._summarized = {}, set()
        self._unseen_emitted, self._submitted_unknown = OrderedDict(), OrderedDict()
        return state

    async def close(self, **kwargs: Any) -> None:
        if self._closed:
            return
        self._closed = True
        self._tasks = None
        if self._pc is not None:
            self._pc.stop()
            if self.scheduler is not None:
                self.scheduler.periodic_callbacks.pop(f"{self.name}-tick", None)
        if self._forwarder is not None:
            with self._guard("close"):
                # (the export process emits what is open when its input ends)
                self._forward_all()
        elif self._ext is not None:
            with self._guard("close"):
                self._emit_all_at_shutdown()
        for undo in reversed(self._undo):
            with self._contain("unwrap"):
                undo()
        self._undo.clear()
        loop = asyncio.get_running_loop()
        if self.export_process is not None:
            await loop.run_in_executor(None, self.export_process.stop, _CLOSE_TIMEOUT)
        pipeline = self.pipeline
        if pipeline is not None:
            await loop.run_in_executor(None, pipeline.stop_threads, _CLOSE_TIMEOUT)
            try:
                await asyncio.wait_for(
                    loop.run_in_executor(None, pipeline.close_providers, _CLOSE_TIMEOUT),
                    2 * _CLOSE_TIMEOUT,
                )
            except asyncio.TimeoutError:
                logger.error(
                    "dask_otel_spans: exporters did not flush within %ss",
                    2 * _CLOSE_TIMEOUT,
                )
        _LOCAL_PLUGINS.pop(self._token, None)

    # -- wrapping dask internals -----------------------------------------------------

    def _wrap_heartbeats(self) -> None:
        ext = self._ext
        scheduler = self.scheduler
        plugin_ref = weakref.ref(self)

        original_span_hb = ext.heartbeat

        @functools.wraps(original_span_hb)
        def span_heartbeat(ws: Any, data: dict) -> None:
            original_span_hb(ws, data)
            plugin = plugin_ref()
            if plugin is not None and not plugin._closed:
                plugin._on_span_heartbeat(data)

        ext.heartbeat = span_heartbeat

        def undo_span_hb() -> None:
            if ext.__dict__.get("heartbeat") is span_heartbeat:
                if getattr(original_span_hb, "__self__", None) is ext:
                    del ext.heartbeat
                else:
                    ext.heartbeat = original_span_hb

        self._undo.append(undo_span_hb)

        original_worker_hb = scheduler.handlers.get("heartbeat_worker")
        if original_worker_hb is None:
            return

        @functools.wraps(original_worker_hb)
        def heartbeat_worker(*args: Any, **kwargs: Any) -> Any:
            result = original_worker_hb(*args, **kwargs)
            plugin = plugin_ref()
            if plugin is not None and not plugin._closed:
                plugin._on_worker_heartbeat(result, kwargs.get("metrics"))
            return result

        scheduler.handlers["heartbeat_worker"] = heartbeat_worker

        def undo_worker_hb() -> None:
            if scheduler.handlers.get("heartbeat_worker") is heartbeat_worker:
                scheduler.handlers["heartbeat_worker"] = original_worker_hb

        self._undo.append(undo_worker_hb)

    def _on_span_heartbeat(self, data: Mapping[Hashable, float]) -> None:
        if not data or self.pump is None:
            return
        forwarder = self._forwarder
        if forwarder is not None:
            with self._guard("heartbeat"):
                # (their spans first: the export process sums the deltas into them)
                forwarder.forward_new_spans()
                self.export_process.forward_deltas(data)
            return
        with self._guard("heartbeat"):
            # O(1) here: the metrics thread looks the span names up
            self.pump.submit("add_span_deltas", data, self._span_tags)

    def _on_worker_heartbeat(self, result: Any, metrics: Any) -> None:
        if self.pump is None or not isinstance(result, dict):
            return
        if result.get("status") != "OK" or not isinstance(metrics, dict):
            return
        with self._guard("worker-heartbeat"):
            digests = metrics.get("digests_total_since_heartbeat") or {}
            worker_wide = {
                k: v
                for k, v in digests.items()
                if isinstance(k, tuple)
                and k
                and k[0] not in names.CONTEXTS_WITH_SPAN_ID
            }
            if worker_wide:
                self.pump.submit("add_worker_deltas", worker_wide)

    # -- hooks: O(1) each, the work happens in the pass ------------------------------
    # update_graph, log_event and remove_client append one tuple to a deque: not
    # timed by _guard (as transition), whose clock reads would cost more than that

    def update_graph(self, scheduler: Scheduler, *, tasks: Any = (),
                     annotations: Mapping[str, Any] | None = None,
                     client: str | None = None, **kwargs: Any) -> None:
        if self._ext is None or self._closed:
            return
        try:
            otel = span_of_key = None
            if annotations:
                otel = annotations.get(names.ANNOTATION_KEY)
                span_of_key = annotations.get("span")
            self._pending.append(
                (_GRAPH, len(self._ext.spans), time(), client, tasks, otel,
                 span_of_key)
            )
        except Exception:
            self._log_failure("update_graph")

    def log_event(self, topic: str, msg: Any, **kwargs: Any) -> None:
        if topic != names.EVENT_TOPIC or self._ext is None or self._closed:
            return
        try:
            self._pending.append((_NOTICE, len(self._ext.spans), time(), msg))
        except Exception:
            self._log_failure("log_event")

    def remove_client(self, scheduler: Scheduler, client: str, **kwargs: Any) -> None:
        if self._ext is None or self._closed:
            return
        try:
            self._pending.append((_CLIENT_GONE, len(self._ext.spans), time(), client))
        except Exception:
            self._log_failure("remove_client")

    def transition(self, key: Any, start: str, finish: str, *args: Any,
                   **kwargs: Any) -> None:
        # Called for every transition of every task: a set insertion when a task
        # settles, so that the next pass looks at its span again (and only then).
        # From one settled state to another (memory -> released -> forgotten, as the
        # client lets its results go) the group's ``done`` cannot change: nothing.
        # Not timed by _guard: the clock reads would cost more than the work.
        forwarder = self._forwarder
        settles = finish in _SETTLED_STATES
        if forwarder is not None:
            # forwarded: the group of a task that settles or starts (again), once
            # per tick
            if settles is (start in _SETTLED_STATES):
                return
        elif not settles or start in _SETTLED_STATES:
            return
        tasks = self._tasks
        if tasks is None:
            return
        try:
            ts = tasks.get(key)
            if ts is None:
                return
            if forwarder is not None:
                forwarder.touched.add(ts.group)
            else:
                span_id = ts.group.span_id
                if span_id is not None:
                    self._settled.add(span_id)
        except Exception:
            self._log_failure("transition")

    # -- processing queued events ----------------------------------------------------

    def _drain(self) -> Iterator[None]:
        """Process what the hooks queued, in order; yields between small items of
        work so that the caller can cut it in slices."""
        if self._adopting is not None:
            yield from self._adopt_existing_spans()
        pending = self._pending
        notices = 0  # handled in this step
        grace = self.grace  # (for the notices of this step)
        lazy_wait = max(self.config.lazy_timeout, grace)
        while pending:
            event = pending.popleft()
            kind, n_spans, now = event[:3]
            if n_spans > self._n_known:
                yield from self._register_new_spans(n_spans)
            if kind == _GRAPH:
                _, _, _, client, tasks, otel, span_of_key = event
                if otel:
                    yield from self._absorb_annotations(otel)
                yield from self._mark_activity(tasks, span_of_key, now, client)
            elif kind == _SPANS_GRAPH:
                _, _, _, client, span_ids, otel = event
                if otel:
                    yield from self._absorb_annotations(otel)
                yield from self._mark_spans_active(span_ids, now, client)
            elif kind == _NOTICE:
                # The notice may have overtaken the graph event that made its spans
                # (different connections): register every span that exists now, so
                # that "in ext.spans but not open" means "emitted already".
                msg = event[3]
                # one notice, or a batch of them from an asynchronous client
                batch = msg if isinstance(msg, (list, tuple)) else (msg,)
                spans = self._ext.spans
                for notice in batch:
                    # a graph may have made spans while the batch was cut
                    if len(spans) > self._n_known:
                        yield from self._register_new_spans(len(spans))
                    try:
                        self._on_close_notice(notice, now, grace, lazy_wait)
                    except Exception:
                        self._log_failure("close-notice")
                    notices += 1
                    if notices >= _NOTICES_PER_STEP:
                        notices = 0
                        yield
                        grace = self.grace
                        lazy_wait = max(self.config.lazy_timeout, grace)
                # (the next events go on in this step: a burst of notices, one
                # event each from a synchronous client, runs a few to a step)
                continue
            else:
                yield from self._on_client_gone(event[3], now)
            notices = 0
            yield  # a burst of small events must not run as one step
            grace = self.grace
            lazy_wait = max(self.config.lazy_timeout, grace)
        # spans created other than by a graph submission
        yield from self._register_new_spans(len(self._ext.spans))

    def _adopt_existing_spans(self) -> Iterator[None]:
        """Spans created before the plugin: adopt those still running (with their
        ancestors, which are still running too)."""
        n = 0
        for span in self._adopting:
            n += 1
            if n % _CHECK_EVERY == 0:
                yield
            if span.id in self._open or all(map(_group_done, span.groups)):
                continue
            chain = []
            node: Span | None = span
            while node is not None and node.id not in self._open:
                chain.append(node)
                node = node.parent
            for node in reversed(chain):
                self._register(node)
        self._adopting = None

    def _register_new_spans(self, upto: int) -> Iterator[None]:
        """Register the spans the extension created since the last call, up to the
        ``upto``-th: the newest entries of its insertion-ordered dict, O(new)."""
        spans = self._ext.spans
        n = len(spans)
        upto = min(upto, n)
        start = self._n_known
        if upto <= start:
            return
        fresh = list(islice(reversed(spans.values()), n - upto, n - start))
        self._n_known = upto
        for i, span in enumerate(reversed(fresh), 1):
            self._register(span)
            if i % _CHECK_EVERY == 0:
                yield

    def _register(self, span: Span) -> None:
        if span.id in self._unseen_emitted:
            return
        rec = self._open.get(span.id)
        if rec is None:
            rec = _OpenSpan(span.id, tuple(span.name), self._chain_of(span))
            self._open[span.id] = rec
            parent = span.parent
            parent_rec = self._open.get(parent.id) if parent is not None else None
            if parent_rec is not None:
                rec.carried.update(parent_rec.carried)
        parent = span.parent
        if parent is not None:
            parent_rec = self._open.get(parent.id)
            if parent_rec is not None and span.id not in parent_rec.open_children:
                parent_rec.open_children.add(span.id)
                # a new open child: the ancestors' verdicts of this pass are stale
                self._forget_verdicts_along(rec.ids)
        rec.span = span
        rec.last_activity = time()
        self._awaiting_graph.pop(span.id, None)
        running = _a_running_group(span)
        if running is None:
            self._look_again(rec)
        else:
            # Not done: when a task of that group settles, the transition hook
            # notes the span, and the next pass sets its check a grace period
            # later; a check now would only say it runs (one check less per span,
            # the most of all on spans of one task)
            rec.unfinished_group = running
        if not rec.counted and self.pump is not None:
            rec.counted = True
            self._metric_calls.append(("span_opened", (rec.tags,)))

    def _chain_of(self, span: Span) -> tuple[str, ...]:
        """The ids of ``span`` and its ancestors, root first."""
        return chain_ids(span)

    def _absorb_annotations(self, otel: Any) -> Iterator[None]:
        """Apply the W3C contexts of an ``otel`` annotation ({key: {dask id: headers}},
        one value object per span chain) to the open spans."""
        if not isinstance(otel, Mapping):
            self._log_once(
                "bad-annotation", "ignoring an %r annotation that is not a mapping "
                "of dask span id to W3C headers: %.200r", names.ANNOTATION_KEY, otel,
            )
            return
        seen: set[int] = set()
        # spans given their contexts by an earlier chain of this annotation: the
        # chains below a span all carry the same contexts for it and its ancestors
        absorbed: set[str] = set()
        for i, value in enumerate(otel.values(), 1):
            if id(value) in seen:
                if i % (_CHECK_EVERY * 16) == 0:
                    yield
                continue
            seen.add(id(value))
            yield  # each distinct chain is looked at: a few µs
            if type(value) is dict and self._chain_known(value, absorbed):
                continue
            carried = carried_headers(value)
            if carried is None:
                self._log_once(
                    "bad-annotation", "ignoring an %r annotation that is not a mapping "
                    "of dask span id to W3C headers: %.200r",
                    names.ANNOTATION_KEY, value,
                )
                continue
            for dask_id in carried:
                if dask_id in absorbed or type(dask_id) is not str:
                    continue
                absorbed.add(dask_id)
                rec = self._open.get(dask_id)
                if rec is not None:
                    rec.carried.update(carried)
                    rec.helper = True
                    rec.submitted = True
                    if rec.span is None:
                        # its tasks went to another span's group: its wait for a
                        # graph is over. (A span with tasks is queued by them; being
                        # a helper's can only make it wait longer, for the notice.)
                        self._look_again(rec)
                elif dask_id not in self._ext.spans:
                    self._remember(self._submitted_unknown, dask_id)

    def _chain_known(self, chain: dict[Any, Any], absorbed: set[str]) -> bool:
        """Whether every span of a carried ``chain`` not absorbed yet is open with
        its own context from its close notice, which carried this very chain (the
        client helper sends its annotation's value as the notice's ``otel``): then
        only the graph's coming is news, and the chain need not be taken in again.
        A graph computed after its blocks closed (lazy collections) brings one
        chain per leaf span, each taken in already from that span's notice."""
        open_spans = self._open
        known = []
        for dask_id in chain:
            if dask_id in absorbed:
                continue
            rec = open_spans.get(dask_id)
            if rec is None or not rec.helper or dask_id not in rec.carried:
                return False
            known.append(rec)
        for rec in known:
            absorbed.add(rec.id)
            rec.submitted = True
            if rec.span is None:
                self._look_again(rec)  # (as for a chain taken in, below)
        return True

    def _mark_activity(
        self, keys: Any, span_of_key: Any, now: float, client: str | None
    ) -> Iterator[None]:
        """The spans of these (new or changed) tasks, and their ancestors, saw
        activity: they are not idle.

        A task's span comes from the ``span`` annotation the scheduler passed (it
        outlives the task, which may be forgotten by now), else from its group.
        """
        span_ids: set[str] = set()
        yield from collect_span_ids(
            keys, span_of_key, self.scheduler.tasks, span_ids, _CHECK_EVERY * 16
        )
        yield from self._mark_spans_active(span_ids, now, client)

    def _mark_spans_active(
        self, span_ids: Iterable[str], now: float, client: str | None
    ) -> Iterator[None]:
        """These spans (of new or changed tasks), and their ancestors, saw activity:
        they are not idle."""
        spans = self._ext.spans
        marked: set[str] = set()
        for i, span_id in enumerate(span_ids, 1):
            if i % _CHECK_EVERY == 0:
                yield
            node = spans.get(span_id)
            rec = self._open.get(span_id)
            if rec is not None and rec.span is not None and (
                rec.unfinished_group is None
            ):
                # A check is due only if the span may be done already (tasks that
                # were done before the graph came); else its tasks have it checked
                # a grace period after they settle, and it queues its parent when
                # done. (So does a span with a group found unfinished.)
                running = _a_running_group(rec.span)
                if running is None:
                    self._look_again(rec)
                else:
                    rec.unfinished_group = running
            # up the tree, stopping at an ancestor this call marked already: O(spans)
            while node is not None and node.id not in marked:
                marked.add(node.id)
                rec = self._open.get(node.id)
                if rec is not None:
                    self._forget_verdicts_along((rec.id,))
                    rec.last_activity = now
                    rec.done_since = None
                    if client:
                        rec.clients.add(client)
                node = node.parent

    def _on_close_notice(self, msg: Any, now: float, grace: float,
                         lazy_wait: float | None = None) -> None:
        """The client helper's block exited: mark the spans it opened as closed
        (``grace``: the grace period now; ``lazy_wait``: the wait for a graph,
        lazy-timeout or grace if longer, worked out once by the caller)."""
        try:
            ids = tuple(msg["ids"])
            tags = tuple(map(str, msg["name"]))
            opened = int(msg["opened"])
            enter = float(msg["enter"])
            exit_ = float(msg["exit"])
            if not ids or len(ids) != len(tags) or not 1 <= opened <= len(ids):
                raise ValueError("inconsistent ids/name/opened")
            if not all(map(isinstance, ids, repeat(str))):
                raise TypeError("span ids must be strings")
        except Exception as e:
            self._log_once(
                "bad-notice", "ignoring a malformed close notice on topic %r (%s): "
                "%.200r", names.EVENT_TOPIC, e, msg,
            )
            return
        carried = carried_headers(msg.get("otel")) or {}
        lazy = msg.get("lazy") is True
        client = msg.get("client")
        if not isinstance(client, str):
            client = None
        spans = self._ext.spans
        for level in range(len(ids) - opened, len(ids)):
            dask_id = ids[level]
            rec = self._open.get(dask_id)
            if rec is None:
                if dask_id in spans or dask_id in self._unseen_emitted:
                    continue  # emitted already, or finished before the plugin
                rec = _OpenSpan(dask_id, tags[: level + 1], ids[: level + 1])
                self._open[dask_id] = rec
                if self._submitted_unknown.pop(dask_id, False) is None:
                    rec.submitted = True
            rec.helper = True
            rec.carried.update(carried)
            if client is not None:
                rec.clients.add(client)
            if rec.span is None and lazy:
                rec.awaiting_graph = True
            rec.closed_at = now
            rec.close_reason = names.CLOSE_REASON_CLIENT
            rec.enter, rec.exit = enter, exit_
            if rec.span is not None:
                self._look_again(rec)
            elif rec.awaiting_graph and not (rec.submitted or rec.client_gone):
                # not seen by the scheduler, and its graph is to come (the blocks
                # of most lazy collections): the wait :meth:`_ready_at` would set
                if lazy_wait is None:
                    lazy_wait = max(self.config.lazy_timeout, grace)
                self._wake_up_at(rec, now + lazy_wait)
            else:
                # not seen by the scheduler: nothing to check, only a wait to set
                wait_until = self._ready_at(rec, now, grace)
                if wait_until is not None:
                    self._wake_up_at(rec, wait_until)

    def _on_client_gone(self, client: str, now: float) -> Iterator[None]:
        for i, rec in enumerate(list(self._open.values()), 1):
            if i % (_CHECK_EVERY * 4) == 0:
                yield
            waiting = rec.closed_at is None or (rec.span is None and rec.awaiting_graph)
            if rec.helper and waiting and client in rec.clients:
                rec.clients.discard(client)
                if not rec.clients:
                    rec.client_gone = True
                    rec.last_activity = max(rec.last_activity, now)
                    self._look_again(rec)

    @staticmethod
    def _remember(ids: OrderedDict[str, None], dask_id: str) -> None:
        ids[dask_id] = None
        while len(ids) > _MAX_REMEMBERED:
            ids.popitem(last=False)

    # -- the periodic pass -----------------------------------------------------------

    def _tick(self) -> None:
        if self._closed:
            return
        if self.export_share_watch is not None:
            self._watch_export_share()
        if self._work is not None:
            return
        if self._forwarder is not None:
            self._forward_tick()
            return
        self._work = self._one_pass()
        self._run_slice()

    def _forward_tick(self) -> None:
        """Forward what happened since the last tick to the export process; first
        the spans still running to a new export process (in slices)."""
        process = self.export_process
        if process is not None and process.launches != self._launches_seen:
            # a new export process (the previous one died): it knows no span, and
            # what went to the old one after its last report may be lost
            self._launches_seen = process.launches
            self._adopt(resend_from=process.confirmed_position + 1)
            return
        # (in slices of tick-budget: a graph of many spans and tasks is much to
        # forward, and the event loop is not to wait for all of it)
        self._work = self._forwarder.tick_steps(
            self._pending, len(self.scheduler.workers)
        )
        self._run_slice()

    def _adopt(self, resend_from: int | None = None) -> None:
        """Forward the spans that exist and still run, in slices of the event loop
        (the ticks wait for it); and those from ``resend_from`` on, done or not
        (:meth:`SpanForwarder.adopt`)."""
        self._work = self._forwarder.adopt(resend_from)
        IOLoop.current().add_callback(self._run_slice)

    def _forward_all(self) -> None:
        """Forward everything now, a span adoption in progress included (close,
        flush, hand-over)."""
        forwarder = self._forwarder
        if forwarder is None:
            return
        try:
            for _ in self._work or ():
                pass
        finally:
            self._work = None
        forwarder.tick(self._pending, len(self.scheduler.workers))

    def _watch_export_share(self) -> None:
        """Say once when exporting takes a noticeable share of the scheduler
        process's CPU, and that the export process would take it elsewhere."""
        with self._guard("export-share"):
            found = self.export_share_watch.check()
            if found is not None:
                share, window = found
                self._log_once(
                    "export-share", "exporting in the scheduler process took %.0f%% "
                    "of its CPU over the last %.0f s (%d spans emitted so far); "
                    "otel-spans.export-process: auto (the default) moves that work "
                    "to a child process", share * 100, window, self.emitted_count,
                    level=logging.INFO,
                )

    def _run_slice(self) -> None:
        """Run the pass in progress for at most ``tick-budget``; the rest goes to a
        new event-loop callback."""
        work = self._work
        if work is None:
            return
        if self._closed:
            self._work = None
            return
        more = False
        with self._guard("tick"):
            deadline = _time.perf_counter() + self.config.tick_budget
            try:
                for _ in work:
                    if _time.perf_counter() > deadline:
                        more = True
                        break
            finally:
                self._deliver()
        if more:
            IOLoop.current().add_callback(self._run_slice)
        else:
            self._work = None

    def _finish_work(self) -> None:
        """Run what is left of the pass in progress and of the queued events, in one
        go (close, hand-over)."""
        try:
            for _ in self._work or ():
                pass
            self._work = None
            for _ in self._drain():
                pass
        finally:
            self._work = None
            self._deliver()

    def _one_pass(self) -> Iterator[None]:
        """Process queued events, then look at the open spans that changed or whose
        wait ran out, deepest first (children before their parents), and emit those
        that are ready."""
        yield from self._drain()
        now = time()
        grace = self.grace
        yield from self._wake_due(now)
        yield from self._take_settled(now, grace)
        if not self._to_check:
            return
        self._forget_pass_verdicts()
        self._verdicts_in_step = 0
        self._verdict_limit = _VERDICTS_PER_STEP
        try:
            yield from self._check_queued(now, grace)
        finally:
            self._verdict_limit = math.inf
            self._forget_pass_verdicts()

    def _check_queued(self, now: float, grace: float) -> Iterator[None]:
        """Check the queued spans, deepest first; emit those that are ready."""
        to_check = self._to_check
        n = 0
        while to_check:
            _, dask_id = heapq.heappop(to_check)
            self._queued.discard(dask_id)
            rec = self._open.get(dask_id)
            if rec is None:
                continue
            self.readiness_checks += 1
            try:
                ready_at = self._ready_at(rec, now, grace)
            except _OutOfStep:
                # a large open tree: the next step goes on with its walk
                self._look_again(rec)
                ready_at = None
                n = _CHECKS_PER_STEP
            except Exception:
                # never drop a span from the queue: look again after a grace period
                self._log_once(
                    "error:readiness", "unexpected error checking span %s (logged "
                    "once)", rec.id, level=logging.ERROR, exc_info=True,
                )
                ready_at = now + max(grace, self.config.tick_interval)
            if ready_at is not None and ready_at <= now:
                try:
                    if not self._emit_in_one_step(rec, now, complete=True):
                        yield from self._emit_in_steps(rec, now, complete=True)
                except Exception:
                    self._log_failure("emit")
                n += _EMISSION_WEIGHT
            else:
                if ready_at is not None:
                    self._wake_up_at(rec, ready_at)
                n += 1
            if n < _CHECKS_PER_STEP and self._verdicts_in_step < _VERDICTS_PER_STEP:
                continue
            yield
            n = 0
            self._verdicts_in_step = 0
            if self._pending:
                # events arrived while the pass was cut: take them in before the
                # next verdict (they queue the spans they touch, and forget the
                # verdicts of those spans and their ancestors, not the others')
                yield from self._drain()
                now = time()

    def _look_again(self, rec: _OpenSpan) -> None:
        """Queue an open span for the next readiness check (O(log n))."""
        if rec.id not in self._queued:
            self._queued.add(rec.id)
            heapq.heappush(self._to_check, (-rec.depth, rec.id))

    def _wake_up_at(self, rec: _OpenSpan, when: float) -> None:
        """Look at a waiting span again at ``when``, unless an earlier wake-up is
        set (that one looks again and sets the next)."""
        if rec.span is None and rec.awaiting_graph and not (
            rec.submitted or rec.client_gone
        ):
            awaiting = self._awaiting_graph
            if rec.id in awaiting:
                return
            # (the same wait for all, from the notice's time: in order, unless the
            # grace period grew past lazy-timeout; such a wait goes to the heap)
            if not awaiting or when >= self._awaiting_until:
                awaiting[rec.id] = self._awaiting_until = when
                return
        if rec.wake_at is None or when < rec.wake_at:
            rec.wake_at = when
            heapq.heappush(self._wakeups, (when, rec.id))

    def _wake_due(self, now: float) -> Iterator[None]:
        """Queue the spans whose wake-up time has come."""
        wakeups = self._wakeups
        n = 0
        while wakeups and wakeups[0][0] <= now:
            when, dask_id = heapq.heappop(wakeups)
            rec = self._open.get(dask_id)
            if rec is not None and rec.wake_at is not None and rec.wake_at <= now:
                rec.wake_at = None
                self._look_again(rec)
            n += 1
            if n % _CHECK_EVERY == 0:
                yield
        awaiting = self._awaiting_graph
        while awaiting and next(iter(awaiting.values())) <= now:
            dask_id, _ = awaiting.popitem(last=False)
            rec = self._open.get(dask_id)
            if rec is not None:
                self._look_again(rec)
            n += 1
            if n % _CHECK_EVERY == 0:
                yield

    def _take_settled(self, now: float, grace: float) -> Iterator[None]:
        """Look at the open spans whose tasks settled since the last pass once a
        grace period has passed, not now.

        A span whose last task settled cannot be ready before its grace period,
        counted from that task's finish (which came before this pass): the check at
        ``now + grace`` judges it done and, closed, emits it, the parents its
        emission queues with it. One readiness check per span of one task, not two
        (one now that could only start the wait, one when it ends), for at most one
        tick of latency more. A span found not done then waits for its next task
        to settle, as it would have now.
        """
        settled, self._settled = self._settled, set()
        due = now + grace
        for i, dask_id in enumerate(settled, 1):
            rec = self._open.get(dask_id)
            if rec is not None:
                # (a task of a span judged done ran again: its last finish moved)
                rec.done_since = None
                self._wake_up_at(rec, due)
            if i % (_CHECK_EVERY * 4) == 0:
                yield

    def _forget_pass_verdicts(self) -> None:
        self._pass_done = {}
        self._pass_finished = {}
        self._done_walks = {}
        self._finished_walks = {}
        self._group_walks = {}

    def _forget_verdicts_along(self, ids: Iterable[str]) -> None:
        """Forget this pass's verdicts (and walks in progress) of these spans: one
        that changed, and its ancestors, whose verdicts included it."""
        for memo in (self._pass_done, self._pass_finished, self._done_walks,
                     self._finished_walks, self._group_walks):
            if memo:  # (empty outside a pass, and most of the time within one)
                for dask_id in ids:
                    memo.pop(dask_id, None)

    def _count_verdict(self) -> None:
        """One more verdict to work out in this step, if the step has room for it."""
        if self._verdicts_in_step >= self._verdict_limit:
            raise _OutOfStep
        self._verdicts_in_step += 1

    def _open_with_tasks(self, ids: list[str]) -> Iterator[tuple[int, _OpenSpan]]:
        """(position, record) of the spans of ``ids`` still open and seen by the
        scheduler; an emitted child counts as done, its finish time is in its
        parent's record."""
        open_spans = self._open
        for i, dask_id in enumerate(ids):
            rec = open_spans.get(dask_id)
            if rec is not None and rec.span is not None:
                yield i, rec

    def _is_done(self, rec: _OpenSpan) -> bool:
        """Span.done, but reusing this pass's verdicts for open children, taking
        emitted children as done and open closed children as not done yet (they
        are emitted first). A walk of many open children that runs out of step
        (:class:`_OutOfStep`) is kept, and the next call goes on with it."""
        memo = self._pass_done
        cached = memo.get(rec.id)
        if cached is not None:
            return cached
        children = self._done_walks.pop(rec.id, None)
        if children is None:
            self._count_verdict()
            if not self._own_groups_done(rec):
                memo[rec.id] = False
                return False
            if not rec.open_children:
                rec.unfinished_child = None
                memo[rec.id] = True
                return True
            if not self._unfinished_child_done(rec):
                memo[rec.id] = False
                return False
            children = list(rec.open_children)
        for i, child_rec in self._open_with_tasks(children):
            if child_rec.closed_at is not None:
                # Closed: its own checks emit it once done, no later than this span
                # can be ready (its finish, close and activity come before this
                # span's), and its emission queues this span again. Until then this
                # span waits for it, with no walk of its waiting siblings pass
                # after pass (one look per emitted child, not one per open child)
                rec.unfinished_child = child_rec.id
                memo[rec.id] = False
                return False
            try:
                child_done = self._is_done(child_rec)
            except _OutOfStep:
                self._done_walks[rec.id] = children[i:]
                raise
            if not child_done:
                rec.unfinished_child = child_rec.id
                memo[rec.id] = False
                return False
        rec.unfinished_child = None
        memo[rec.id] = True
        return True

    def _unfinished_child_done(self, rec: _OpenSpan) -> bool:
        """Whether the open child found not done by the last check of ``rec`` is done
        by now (True when there is none): while it runs, a check of ``rec`` need not
        walk its other children."""
        child_id = rec.unfinished_child
        if child_id is None or child_id not in rec.open_children:
            return True
        child_rec = self._open.get(child_id)
        if child_rec is None or child_rec.span is None:
            return True
        if child_rec.closed_at is not None:
            return False  # (waited for until it is emitted: see _is_done)
        return self._is_done(child_rec)

    def _own_groups_done(self, rec: _OpenSpan) -> bool:
        """Whether the span's own task groups are done: the group found unfinished
        last time first (O(1) while it runs); a look at many groups counts as one
        verdict per ``_GROUPS_PER_VERDICT`` and goes on over steps."""
        unfinished = rec.unfinished_group
        if unfinished is not None:
            if not _group_done(unfinished):
                return False
            rec.unfinished_group = None
            if len(rec.span.groups) == 1:
                return True  # (that group: groups are only ever added)
        groups = self._group_walks.pop(rec.id, None)
        if groups is None:
            groups = rec.span.groups
            if len(groups) > _GROUPS_PER_VERDICT:
                groups = list(groups)
        for i, tg in enumerate(groups, 1):
            if not _group_done(tg):
                rec.unfinished_group = tg
                return False
            if i % _GROUPS_PER_VERDICT == 0 and i < len(groups):
                try:
                    self._count_verdict()
                except _OutOfStep:
                    self._group_walks[rec.id] = groups[i:]
                    raise
        rec.unfinished_group = None
        return True

    def _finished_at(self, rec: _OpenSpan) -> float:
        """When the last task of a done span tree finished (0 without tasks): its own
        groups, its open children, and what its emitted children left in the record;
        O(own groups + open children) with this pass's verdicts reused, never the
        whole history of the tree; a long walk goes on over steps as in
        :meth:`_is_done`."""
        memo = self._pass_finished
        cached = memo.get(rec.id)
        if cached is not None:
            return cached
        walk = self._finished_walks.pop(rec.id, None)
        if walk is None:
            self._count_verdict()
            out = 0.0
            for tg in rec.span.groups:
                if tg.stop > out:
                    out = tg.stop
            children = list(rec.open_children) if rec.open_children else None
        else:
            out, children = walk
        # (children emitted since the walk began left their time here)
        out = max(out, rec.children_finished_at)
        if children:
            for i, child_rec in self._open_with_tasks(children):
                try:
                    out = max(out, self._finished_at(child_rec))
                except _OutOfStep:
                    self._finished_walks[rec.id] = (out, children[i:])
                    raise
        memo[rec.id] = out
        return out

    def _ready_at(self, rec: _OpenSpan, now: float, grace: float) -> float | None:
        """When the span is ready (done, closed and past the grace period): a time
        at or before ``now`` when it is ready now, a later time when only waiting
        is left, None when it waits for an event (tasks, a close notice)."""
        if rec.span is None:
            # Closed by the client, never seen by the scheduler (so far). When a
            # graph carried it, its tasks went to another span's TaskGroup and
            # will not come. When the client said collections built in the block
            # are still to be computed, wait for their graph (lazy-timeout, or
            # until the client is gone). Otherwise tasks are unlikely but possible
            # (e.g. a collection the client could not see): wait as for an idle span.
            if rec.closed_at is None or rec.id in self._ext.spans:
                return None  # (in ext.spans: registered by the next pass)
            if rec.submitted or rec.client_gone:
                wait = grace
            elif rec.awaiting_graph:
                wait = max(self.config.lazy_timeout, grace)
            else:
                wait = max(self.config.idle_timeout, grace)
            return rec.closed_at + wait
        groups = rec.span.groups
        leaf_group = None
        if not rec.open_children and len(groups) == 1:
            # A span of one task group and no open child (most spans, and all
            # those of one task): its verdict is that group's, and needs none of
            # the walks' bookkeeping
            leaf_group = next(iter(groups))
            if not _group_done(leaf_group):
                rec.unfinished_group = leaf_group
                rec.done_since = None
                return None
            rec.unfinished_group = rec.unfinished_child = None
            self._pass_done[rec.id] = True  # (for its parent's check in this pass)
        elif not self._is_done(rec):
            rec.done_since = None
            return None
        if rec.done_since is None:
            # the grace period covers heartbeats still in flight: count it from
            # when the last task finished, not from when this pass noticed
            if leaf_group is None:
                finished = self._finished_at(rec)
            else:
                # (as _finished_at: its emitted children left their finish here)
                finished = max(leaf_group.stop, rec.children_finished_at)
                self._pass_finished[rec.id] = finished
            rec.finished_at = finished
            rec.done_since = min(now, finished or now)
            # its parent may be done now too, unless the parent's last check found
            # another child not done (that one queues it when done; an emitted
            # child queues its parent too), or this span is closed: its parent
            # waits for its emission, which queues the parent
            if rec.depth > 1 and rec.closed_at is None:
                parent_rec = self._open.get(rec.ids[-2])
                if parent_rec is not None and (
                    parent_rec.unfinished_child is None
                    or parent_rec.unfinished_child == rec.id
                ):
                    self._look_again(parent_rec)
        quiet_since = max(rec.done_since, rec.last_activity)
        if rec.closed_at is not None:
            return max(quiet_since, rec.closed_at) + grace
        if rec.helper and not rec.client_gone:
            return None
        ready_at = quiet_since + max(self.config.idle_timeout, grace)
        if ready_at <= now:
            rec.close_reason = (
                names.CLOSE_REASON_CLIENT_GONE
                if rec.helper
                else names.CLOSE_REASON_IDLE
            )
        return ready_at

    # -- emission --------------------------------------------------------------------

    def _emit_all_at_shutdown(self) -> None:
        self._finish_work()
        self._forget_pass_verdicts()
        now = time()
        for rec in sorted(self._open.values(), key=_minus_depth):
            if self._open.get(rec.id) is not rec:
                continue
            if rec.span is None:
                complete = rec.closed_at is not None
            else:
                done = self._is_done(rec)
                complete = done and (rec.closed_at is not None or not rec.helper)
                if rec.closed_at is None:
                    rec.close_reason = names.CLOSE_REASON_SHUTDOWN
            with self._contain("emit"):
                self._emit(rec, now, complete=complete)
        self._forget_pass_verdicts()

    def _emit(self, rec: _OpenSpan, now: float, *, complete: bool) -> None:
        """Copy the span and hand it to the emitter thread; forget the record."""
        if not self._emit_in_one_step(rec, now, complete=complete):
            for _ in self._emit_in_steps(rec, now, complete=complete):
                pass
        self._deliver()

    def _emit_in_one_step(self, rec: _OpenSpan, now: float, *, complete: bool) -> bool:
        """:meth:`_emit`, without delivering, of a span copied in one go (most: no
        children, few task groups) with no generator; False for any other span,
        left as it was (:meth:`_emit_in_steps` copies it)."""
        span = rec.span
        snapshot = None
        if span is not None:
            snapshot = snapshot_in_one_step(
                span, with_code=self.config.include_code,
                nthreads_history=self._snapshot_history,
            )
            if snapshot is None:
                return False
        del self._open[rec.id]
        self._awaiting_graph.pop(rec.id, None)
        self._queue_request(rec, now, complete, snapshot)
        return True

    def _emit_in_steps(
        self, rec: _OpenSpan, now: float, *, complete: bool
    ) -> Iterator[None]:
        """:meth:`_emit`, without delivering, of a span with children or many task
        groups, pausing while it copies them."""
        del self._open[rec.id]
        self._awaiting_graph.pop(rec.id, None)
        span = rec.span
        snapshot = None
        if span is not None:
            summarized = self._summarized
            snapshot = yield from iter_snapshot_span(
                span, summarized, with_code=self.config.include_code,
                nthreads_history=self._snapshot_history,
            )
            for i, child in enumerate(span.children, 1):
                summarized.discard(child.id)
                if i % CHILDREN_PER_STEP == 0:
                    yield
        self._queue_request(rec, now, complete, snapshot)

    def _queue_request(
        self, rec: _OpenSpan, now: float, complete: bool, snapshot: Any
    ) -> None:
        """The emitted span's request, to deliver at the end of the slice; its
        parent learns when its tree finished and is looked at again."""
        span = rec.span
        if span is None:
            keep_summary = False
            self._remember(self._unseen_emitted, rec.id)
        else:
            parent = span.parent
            parent_rec = self._open.get(parent.id) if parent is not None else None
            keep_summary = parent_rec is not None
            if parent_rec is not None:
                parent_rec.open_children.discard(span.id)
                if rec.done_since is not None:
                    finished = rec.finished_at  # (worked out when judged done)
                else:
                    # (no step limit: the span is out of the open table already)
                    limit, self._verdict_limit = self._verdict_limit, math.inf
                    try:
                        finished = self._finished_at(rec)
                    finally:
                        self._verdict_limit = limit
                parent_rec.children_finished_at = max(
                    parent_rec.children_finished_at, finished
                )
                if parent_rec.done_since is None:
                    # (a parent judged done already looks again when its wait
                    # runs out: its children's emissions change nothing for it)
                    self._look_again(parent_rec)
                self._summarized.add(span.id)
        self._handed_over += 1
        if self.emitter is not None:
            # The request in its plain form (EmitRequest's fields in order: tags,
            # ids, carried, snapshot, now, complete, close_reason, enter, exit,
            # keep_summary, counted), which the export process's sender marshals as
            # it is; with a dict of its own of the carried headers the translation
            # reads (the root's, which an open root may hold alone, and its own),
            # empty carriers left out: they say what no carrier says
            ids, carried = rec.ids, rec.carried
            root_id, own_id = ids[0], rec.id
            sent = {}
            carrier = carried.get(own_id)
            # (a client's own Mapping class is sent as it is: the sender reads it)
            if carrier is not None and (type(carrier) is not dict or carrier):
                sent[own_id] = carrier
            if root_id != own_id:
                carrier = carried.get(root_id)
                if carrier is None:
                    root = self._open.get(root_id)
                    if root is not None:
                        carrier = root.carried.get(root_id)
                if carrier is not None and (type(carrier) is not dict or carrier):
                    sent[root_id] = carrier
            self._emitted.append((
                rec.tags, ids, sent, snapshot, now, complete, rec.close_reason,
                rec.enter, rec.exit, keep_summary, rec.counted,
            ))

    def _deliver(self) -> None:
        """Hand what the pass emitted and counted so far to the emitter and the
        metrics thread (or the export process): the counts first, so that a span's
        opening is counted before its emission."""
        calls, self._metric_calls = self._metric_calls, []
        if calls and self.pump is not None:
            self.pump.submit_many(calls)
        emitted, self._emitted = self._emitted, []
        if emitted and self.emitter is not None:
            self.emitter.emit_many(emitted)

    # -- introspection (tests, benchmarks, run_on_scheduler) ------------------------

    async def flush(self, timeout: float = 10.0) -> None:
        """Emit whatever is ready now, then flush the emitter, metrics and
        providers."""
        if self._forwarder is not None and not self._closed:
            with self._guard("flush"):
                self._forward_all()
        elif self._ext is not None and not self._closed:
            for _ in range(2):  # a pass already in progress, then a fresh one
                while self._work is not None:
                    await asyncio.sleep(0.001)
                self._tick()
            while self._work is not None:
                await asyncio.sleep(0.001)
        loop = asyncio.get_running_loop()
        if self.export_process is not None:
            await loop.run_in_executor(None, self.export_process.flush, timeout)
        if self.pipeline is not None:
            await loop.run_in_executor(None, self.pipeline.flush, timeout)


def _a_running_group(span: Span) -> Any:
    """The span's first task group, if it is not done; else None (no groups, or
    a done first group: the span needs a look). O(1) in the span's groups."""
    for tg in span.groups:
        return None if _group_done(tg) else tg
    return None


def _minus_depth(rec: _OpenSpan) -> int:
    return -rec.depth


def _restore_plugin(
    token: str, settings: dict[str, Any], had_providers: bool, use_global: bool
) -> OTelSpansPlugin:
    """Unpickle a plugin: the very same object when the scheduler is in the process
    that created it, else a new one configured from this process's environment."""
    plugin = _LOCAL_PLUGINS.get(token)
    if plugin is not None:
        return plugin
    if had_providers:
        logger.warning(
            "dask_otel_spans: providers passed to OTelSpansPlugin cannot travel to a "
            "scheduler in another process; using this scheduler's OTEL_* configuration"
        )
    return OTelSpansPlugin(use_global_providers=use_global, **settings)

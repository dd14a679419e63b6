"""Scheduler preload of the benchmark: the plugin with SDK providers whose exporters
record export latency (done -> exporter) and discard the data, so that the benchmark
measures the plugin and the SDK, not a collector.

With ``BENCH_EXPORT_RECORDS`` set (a file path), the plugin runs with its export
process, whose providers come from :func:`child_providers`: the export process writes
one line per exported span to that file, which :func:`stats` reads on the scheduler.
"""
from __future__ import annotations

import gc
import os
import threading
import time
from collections.abc import Sequence

import bench_clock
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)

import dask_otel_spans
from dask_otel_spans import OTelSpansPlugin

#: seconds from when the scheduler saw a dask span done (bench_clock: its tree's last
#: task finished, or its close notice came if later) to its export; from the span's end
#: as the workers reported it where the clock has no entry
LATENCIES: list[float] = []
#: the same by workload (first tag of the span's name, up to a "-")
LATENCIES_BY_WORKLOAD: dict[str, list[float]] = {}
EXPORTED = [0]
#: seconds from when the scheduler saw a span done to its end as the workers reported
#: it (their clock offset estimate's error): positive when the reported end is later
REPORTED_END_SKEW: list[float] = []
#: longest garbage-collector pause in the scheduler process, seconds
GC_PAUSE = {"max_s": 0.0, "started": 0.0}
#: CPU seconds spent in garbage collection, by thread
GC_CPU_BY_THREAD: dict[int, float] = {}
_GC_CPU_STARTED: dict[int, float] = {}


def _gc_clock(phase: str, info: dict) -> None:
    thread = threading.get_ident()
    if phase == "start":
        GC_PAUSE["started"] = time.perf_counter()
        _GC_CPU_STARTED[thread] = time.thread_time()
        return
    if GC_PAUSE["started"]:
        GC_PAUSE["max_s"] = max(GC_PAUSE["max_s"], time.perf_counter() - GC_PAUSE["started"])
    started = _GC_CPU_STARTED.pop(thread, None)
    if started is not None:
        GC_CPU_BY_THREAD[thread] = (
            GC_CPU_BY_THREAD.get(thread, 0.0) + time.thread_time() - started
        )


def gc_cpu_of_this_thread() -> float:
    """Cumulative CPU seconds the calling thread spent collecting garbage."""
    return GC_CPU_BY_THREAD.get(threading.get_ident(), 0.0)


#: environment variable naming the file of the export process's export records
RECORDS_VARIABLE = "BENCH_EXPORT_RECORDS"
_RECORDS_READ = [0]


def _record(span_id: str, workload: str, end_s: float, exported_s: float) -> None:
    """One dask span reached the exporter; ``end_s``: its end as exported."""
    tree_done_s, done_s = bench_clock.pop_done_at(span_id)
    if tree_done_s is not None:
        REPORTED_END_SKEW.append(end_s - tree_done_s)
        end_s = done_s
    latency = exported_s - end_s
    LATENCIES.append(latency)
    LATENCIES_BY_WORKLOAD.setdefault(workload, []).append(latency)
    EXPORTED[0] += 1


def _read_records() -> None:
    """Feed the export process's new records (complete lines) to :func:`_record`."""
    path = os.environ.get(RECORDS_VARIABLE)
    if not path or not os.path.exists(path):
        return
    with open(path) as f:
        f.seek(_RECORDS_READ[0])
        data = f.read()
    end = data.rfind("\n") + 1
    _RECORDS_READ[0] += len(data[:end].encode())
    for line in data[:end].splitlines():
        span_id, workload, end_s, exported_s = line.split("\t")
        _record(span_id, workload, float(end_s), float(exported_s))


class LatencyExporter(SpanExporter):
    """Records each dask span's export time, in this process or, given a file, as
    lines of that file."""

    def __init__(self, records_file: str | None = None):
        self.records = open(records_file, "a") if records_file else None

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        now = time.time_ns() / 1e9
        lines = []
        for s in spans:
            if "dask.span.id" in (s.attributes or {}):
                span_id = s.attributes["dask.span.id"]
                workload = str(s.attributes["dask.span.name"][0]).split("-")[0]
                if self.records is None:
                    _record(span_id, workload, s.end_time / 1e9, now)
                else:
                    lines.append(f"{span_id}\t{workload}\t{s.end_time / 1e9!r}\t{now!r}\n")
        if lines:
            self.records.write("".join(lines))
            self.records.flush()
        return SpanExportResult.SUCCESS


class NullMetricExporter(MetricExporter):
    def export(self, metrics_data, timeout_millis=10_000, **kwargs):
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis=10_000):
        return True

    def shutdown(self, timeout_millis=30_000, **kwargs):
        pass


def _providers(records_file: str | None = None) -> tuple[TracerProvider, MeterProvider]:
    return batch_providers(LatencyExporter(records_file))


def batch_providers(
    span_exporter: SpanExporter,
) -> tuple[TracerProvider, MeterProvider]:
    """The benchmark's providers: a batch span processor (0.5 s delay) to
    ``span_exporter``, and a periodic metric reader (5 s) to an exporter that
    discards."""
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(
        BatchSpanProcessor(span_exporter, schedule_delay_millis=500,
                           max_queue_size=100_000)
    )
    meter_provider = MeterProvider(
        metric_readers=[
            PeriodicExportingMetricReader(NullMetricExporter(), export_interval_millis=5_000)
        ]
    )
    return tracer_provider, meter_provider


def child_providers() -> tuple[TracerProvider, MeterProvider]:
    """Providers factory of the export process (``otel-spans.providers``)."""
    return _providers(os.environ[RECORDS_VARIABLE])


class NullSpanExporter(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def memory_child_providers() -> tuple[TracerProvider, MeterProvider]:
    """Providers factory of the export process in the memory part: everything is
    translated and handed to the SDK, and nothing kept."""
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(NullSpanExporter()))
    meter_provider = MeterProvider(
        metric_readers=[
            PeriodicExportingMetricReader(NullMetricExporter(), export_interval_millis=5_000)
        ]
    )
    return tracer_provider, meter_provider


def dask_setup(scheduler):
    gc.callbacks.append(_gc_clock)
    if os.environ.get(RECORDS_VARIABLE):
        plugin = OTelSpansPlugin(export_process=True,
                                 providers="bench_preload:child_providers")
    else:
        tracer_provider, meter_provider = _providers()
        plugin = OTelSpansPlugin(tracer_provider=tracer_provider,
                                 meter_provider=meter_provider)
    _loop_stats(plugin).pause_clock = gc_cpu_of_this_thread
    _scale_time(float(os.environ.get(TIME_SCALE_VARIABLE, "1")))
    scheduler.add_plugin(plugin)


#: Run the plugin's clock-driven work this many times less often and in slices this
#: many times longer (``bench_account.py --instructions``: a scheduler slowed by
#: valgrind keeps the native work per tick)
TIME_SCALE_VARIABLE = "BENCH_TIME_SCALE"


def _scale_time(scale: float) -> None:
    if scale == 1:
        return
    from dask_otel_spans.scheduler import plugin as plugin_module

    plugin_module.TICK_INTERVAL *= scale
    plugin_module.TICK_BUDGET *= scale


# The plugin's figures, through its public statistics objects (``loop_stats``,
# ``export_figures()``), or through the attributes of a plugin from before them
# (commits before the one-path redesign, run with --against).


def _loop_stats(plugin):
    """The object that holds the plugin's event-loop figures."""
    return getattr(plugin, "loop_stats", plugin)


def _loop_figures(plugin) -> dict:
    loop = _loop_stats(plugin)
    if loop is plugin:  # (before the redesign)
        return {
            "max_call_s": plugin.max_call_seconds,
            "max_call_by_hook": dict(plugin.max_call_by_hook),
            "max_call_cpu_s": plugin.max_call_cpu_seconds,
            "max_call_cpu_less_gc_s": plugin.max_call_cpu_less_pauses_seconds,
            "max_call_cpu_less_gc_by_hook": dict(
                plugin.max_call_cpu_less_pauses_by_hook
            ),
            "total_call_cpu_s": plugin.total_call_cpu_seconds,
            "total_call_s": plugin.total_call_seconds,
        }
    return {
        "max_call_s": loop.max_seconds,
        "max_call_by_hook": dict(loop.max_seconds_by_place),
        "max_call_cpu_s": loop.max_cpu_seconds,
        "max_call_cpu_less_gc_s": loop.max_cpu_less_pauses_seconds,
        "max_call_cpu_less_gc_by_hook": dict(loop.max_cpu_less_pauses_by_place),
        "total_call_cpu_s": loop.total_cpu_seconds,
        "total_call_s": loop.total_seconds,
    }


def _export_figures(plugin) -> dict:
    """The export session's figures (cumulative)."""
    if hasattr(plugin, "export_figures"):
        return plugin.export_figures().flat()
    if hasattr(plugin, "export_stats"):  # (before the typed figures)
        return plugin.export_stats()
    process = getattr(plugin, "export_process", None)
    if process is not None:  # (before the redesign, with its export process)
        return {**process.child_stats, "sender_cpu_s": process.cpu_seconds}
    return {}


def _sender_cpu(plugin) -> float:
    """CPU seconds of the thread that writes to the export process: the
    ``ChildSender``'s (``transport.sender``), or the ``ExportProcess``'s of commits
    before bc34b7d (``transport.process``), or before the redesign."""
    transport = getattr(plugin, "transport", None)
    sender = getattr(transport, "sender", None)
    if sender is not None:
        return sender.thread.cpu_seconds
    process = getattr(transport, "process", None) or getattr(plugin, "export_process", None)
    return process.cpu_seconds if process is not None else 0.0


def stats(dask_scheduler) -> dict:
    """run_on_scheduler: the plugin's event-loop figures and the export latencies."""
    plugin = dask_scheduler.plugins.get("otel-spans")
    _read_records()
    loop = _loop_figures(plugin) if plugin else {}
    export = _export_figures(plugin) if plugin else {}

    def since_reset(name: str) -> float:
        return export.get(name, 0) - _EXPORT_BASE.get(name, 0)

    return {
        "max_call_s": loop.get("max_call_s", 0.0),
        "max_call_by_hook": loop.get("max_call_by_hook", {}),
        "max_call_cpu_s": loop.get("max_call_cpu_s", 0.0),
        "max_call_cpu_less_gc_s": loop.get("max_call_cpu_less_gc_s", 0.0),
        "max_call_cpu_less_gc_by_hook": loop.get("max_call_cpu_less_gc_by_hook", {}),
        "cpu_by_place": _cpu_by_place(plugin, loop, export, since_reset),
        "total_call_s": loop.get("total_call_s", 0.0),
        "readiness_checks": since_reset("readiness_checks"),
        "handed_over": since_reset("handed_over"),
        "metric_updates": since_reset("metric_updates"),
        "metric_sdk_calls": since_reset("metric_sdk_calls"),
        # (ended_count; emitted_count before bc34b7d)
        "emitted": getattr(plugin, "ended_count", getattr(plugin, "emitted_count", 0)),
        "open": plugin.open_span_count if plugin else 0,
        "grace_s": plugin.grace if plugin else 0.0,
        "latencies": list(LATENCIES),
        "latencies_by_workload": {k: list(v) for k, v in LATENCIES_BY_WORKLOAD.items()},
        "max_gc_pause_s": GC_PAUSE["max_s"],
        "reported_end_skew": list(REPORTED_END_SKEW),
        "plugin_source": os.path.dirname(os.path.abspath(dask_otel_spans.__file__)),
    }


def _cpu_by_place(plugin, loop: dict, export: dict, since_reset) -> dict:
    """CPU seconds of the plugin: on the event loop, and where it exports (the
    sender thread and the export process; or the session, ender and metrics
    threads of the scheduler process)."""
    if plugin is None:
        return {}
    out = {"event loop": loop.get("total_call_cpu_s", 0.0)}
    if "process_cpu_s" in export:
        out["sender thread"] = _sender_cpu(plugin) - _EXPORT_BASE.get("sender_cpu_s", 0)
        out["export process"] = since_reset("process_cpu_s")
    else:
        out["session thread"] = since_reset("session_cpu_s")
        out["ender thread"] = since_reset("ender_cpu_s")
        out["metrics thread"] = since_reset("metrics_cpu_s")
    return out


#: the export session's cumulative figures when the benchmark last reset
_EXPORT_BASE: dict[str, float] = {}


def reset(dask_scheduler) -> None:
    plugin = dask_scheduler.plugins.get("otel-spans")
    if plugin is not None:
        loop = _loop_stats(plugin)
        if loop is plugin:  # (before the redesign)
            plugin.max_call_seconds = plugin.total_call_seconds = 0.0
            plugin.max_call_cpu_seconds = plugin.total_call_cpu_seconds = 0.0
            plugin.max_call_cpu_less_pauses_seconds = 0.0
            plugin.max_call_by_hook.clear()
            plugin.max_call_cpu_less_pauses_by_hook.clear()
        else:
            fresh = type(loop)()
            fresh.pause_clock = loop.pause_clock
            plugin.loop_stats = fresh
        _EXPORT_BASE.clear()
        _EXPORT_BASE.update(_export_figures(plugin))
        _EXPORT_BASE["sender_cpu_s"] = _sender_cpu(plugin)
    _read_records()
    LATENCIES.clear()
    LATENCIES_BY_WORKLOAD.clear()
    REPORTED_END_SKEW.clear()
    GC_PAUSE["max_s"] = 0.0

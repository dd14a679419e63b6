"""Scheduler preload of the benchmark: the plugin with SDK providers whose exporters
record export latency (done -> exporter) and discard the data, so that the benchmark
measures the plugin and the SDK, not a collector."""
from __future__ import annotations

import gc
import threading
import time
from collections.abc import Sequence

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SpanExporter,
    SpanExportResult,
)

from dask_otel_spans import OTelSpansPlugin

#: seconds from a dask span's end (Span.stop: when it became done) to its export
LATENCIES: list[float] = []
#: the same by workload (first tag of the span's name, up to a "-")
LATENCIES_BY_WORKLOAD: dict[str, list[float]] = {}
EXPORTED = [0]
#: dask span id -> wall time when the plugin handed the span to its emitter thread
HANDED_OVER: dict[str, float] = {}
#: seconds from hand-over to export (emitter queue, translation, batch processor), by
#: workload: the part of the latency that is not the plugin's waiting for readiness
HAND_OVER_TO_EXPORT_BY_WORKLOAD: dict[str, list[float]] = {}
#: seconds from a dask span's end to its hand-over, by workload: the plugin's wait
#: (grace period, tick, event-loop lag)
DONE_TO_HAND_OVER_BY_WORKLOAD: dict[str, list[float]] = {}
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


class LatencyExporter(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        now = time.time_ns()
        for s in spans:
            if "dask.span.id" in (s.attributes or {}):
                latency = (now - s.end_time) / 1e9
                LATENCIES.append(latency)
                workload = str(s.attributes["dask.span.name"][0]).split("-")[0]
                LATENCIES_BY_WORKLOAD.setdefault(workload, []).append(latency)
                handed = HANDED_OVER.pop(s.attributes["dask.span.id"], None)
                if handed is not None:
                    HAND_OVER_TO_EXPORT_BY_WORKLOAD.setdefault(workload, []).append(
                        now / 1e9 - handed
                    )
                    DONE_TO_HAND_OVER_BY_WORKLOAD.setdefault(workload, []).append(
                        handed - s.end_time / 1e9
                    )
                EXPORTED[0] += 1
        return SpanExportResult.SUCCESS


class NullMetricExporter(MetricExporter):
    def export(self, metrics_data, timeout_millis=10_000, **kwargs):
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis=10_000):
        return True

    def shutdown(self, timeout_millis=30_000, **kwargs):
        pass


def dask_setup(scheduler):
    gc.callbacks.append(_gc_clock)
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(
        BatchSpanProcessor(LatencyExporter(), schedule_delay_millis=500, max_queue_size=100_000)
    )
    meter_provider = MeterProvider(
        metric_readers=[
            PeriodicExportingMetricReader(NullMetricExporter(), export_interval_millis=5_000)
        ]
    )
    plugin = OTelSpansPlugin(tracer_provider=tracer_provider, meter_provider=meter_provider)
    plugin.pause_clock = gc_cpu_of_this_thread
    scheduler.add_plugin(plugin)


def stats(dask_scheduler) -> dict:
    """run_on_scheduler: the plugin's event-loop figures and the export latencies."""
    plugin = dask_scheduler.plugins.get("otel-spans")
    return {
        "max_call_s": plugin.max_call_seconds if plugin else 0.0,
        "max_call_by_hook": dict(plugin.max_call_by_hook) if plugin else {},
        "max_call_cpu_s": plugin.max_call_cpu_seconds if plugin else 0.0,
        "max_call_cpu_less_gc_s": (
            plugin.max_call_cpu_less_pauses_seconds if plugin else 0.0
        ),
        "max_call_cpu_less_gc_by_hook": (
            dict(plugin.max_call_cpu_less_pauses_by_hook) if plugin else {}
        ),
        "cpu_by_place": _cpu_by_place(plugin),
        "total_call_s": plugin.total_call_seconds if plugin else 0.0,
        "readiness_checks": plugin.readiness_checks if plugin else 0,
        "handed_over": plugin.handed_over_count if plugin else 0,
        "metric_updates": plugin.instruments.updates if plugin else 0,
        "metric_sdk_calls": plugin.instruments.sdk_calls if plugin else 0,
        "emitted": plugin.emitted_count if plugin else 0,
        "open": plugin.open_span_count if plugin else 0,
        "grace_s": plugin.grace if plugin else 0.0,
        "latencies": list(LATENCIES),
        "latencies_by_workload": {k: list(v) for k, v in LATENCIES_BY_WORKLOAD.items()},
        "hand_over_to_export_by_workload": {
            k: list(v) for k, v in HAND_OVER_TO_EXPORT_BY_WORKLOAD.items()
        },
        "done_to_hand_over_by_workload": {
            k: list(v) for k, v in DONE_TO_HAND_OVER_BY_WORKLOAD.items()
        },
        "max_gc_pause_s": GC_PAUSE["max_s"],
    }


def _cpu_by_place(plugin) -> dict:
    """CPU seconds of the plugin: on the event loop, on its two threads."""
    if plugin is None:
        return {}
    return {
        "event loop": plugin.total_call_cpu_seconds,
        "emitter thread": plugin.emitter.cpu_seconds if plugin.emitter else 0.0,
        "metrics thread": plugin.pump.cpu_seconds if plugin.pump else 0.0,
    }


def _record_hand_over(emitter) -> None:
    """Wrap the emitter's ``emit`` (called on the event loop) to note hand-over times."""
    if getattr(emitter, "_bench_recording", False):
        return
    emit = emitter.emit

    def emit_and_record(request) -> None:
        HANDED_OVER[request.ids[-1]] = time.time()
        emit(request)

    emitter.emit = emit_and_record
    emitter._bench_recording = True


def reset(dask_scheduler) -> None:
    plugin = dask_scheduler.plugins.get("otel-spans")
    if plugin is not None and plugin.emitter is not None:
        _record_hand_over(plugin.emitter)
    if plugin is not None:
        plugin.max_call_seconds = 0.0
        plugin.total_call_seconds = 0.0
        plugin.max_call_by_hook.clear()
        plugin.max_call_cpu_seconds = 0.0
        plugin.total_call_cpu_seconds = 0.0
        plugin.max_call_cpu_less_pauses_seconds = 0.0
        plugin.max_call_cpu_less_pauses_by_hook.clear()
        plugin.readiness_checks = 0
        plugin.handed_over_count = 0
        plugin.instruments.updates = 0
        plugin.instruments.sdk_calls = 0
        for worker in (plugin.emitter, plugin.pump):
            if worker is not None:
                worker.cpu_seconds = 0.0
    LATENCIES.clear()
    LATENCIES_BY_WORKLOAD.clear()
    HANDED_OVER.clear()
    HAND_OVER_TO_EXPORT_BY_WORKLOAD.clear()
    DONE_TO_HAND_OVER_BY_WORKLOAD.clear()
    GC_PAUSE["max_s"] = 0.0

"""Scheduler preload of the benchmark: the plugin with SDK providers whose exporters
record export latency (done -> exporter) and discard the data, so that the benchmark
measures the plugin and the SDK, not a collector.

With ``BENCH_EXPORT_RECORDS`` set (a file path), the plugin runs with its export
process, whose providers come from :func:`child_providers`: the export process writes
one line per exported span to that file, which :func:`stats` reads on the scheduler.
With ``BENCH_CHILD_FRAMES`` set too (another path), what the scheduler sends its
export process is recorded there (:func:`record_child_frames`), for
``bench_child.py`` to replay.
"""
from __future__ import annotations

import gc
import os
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
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)

import bench_clock
import dask_otel_spans
from dask_otel_spans import OTelSpansPlugin

#: seconds from when the scheduler saw a dask span done (bench_clock: its tree's last
#: task finished, or its close notice came if later) to its export; from the span's end
#: as the workers reported it where the clock has no entry
LATENCIES: list[float] = []
#: the same by workload (first tag of the span's name, up to a "-")
LATENCIES_BY_WORKLOAD: dict[str, list[float]] = {}
EXPORTED = [0]
#: dask span id -> wall time when the plugin handed the span to its emitter thread
HANDED_OVER: dict[str, float] = {}
#: seconds from hand-over to export (emitter queue, translation, batch processor), by
#: workload: the part of the latency that is not the plugin's waiting for readiness
HAND_OVER_TO_EXPORT_BY_WORKLOAD: dict[str, list[float]] = {}
#: seconds from a dask span's done to its hand-over, by workload: the plugin's wait
#: (grace period, tick, event-loop lag)
DONE_TO_HAND_OVER_BY_WORKLOAD: dict[str, list[float]] = {}
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
    handed = HANDED_OVER.pop(span_id, None)
    if handed is not None:
        HAND_OVER_TO_EXPORT_BY_WORKLOAD.setdefault(workload, []).append(
            exported_s - handed
        )
        DONE_TO_HAND_OVER_BY_WORKLOAD.setdefault(workload, []).append(handed - end_s)
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


#: environment variable naming the file to record the export process's frames in
FRAMES_VARIABLE = "BENCH_CHILD_FRAMES"


def record_child_frames(path: str) -> None:
    """Record what every export process of this scheduler is sent, as it is sent,
    in ``path``: at each start, ``("spec", PipelineSpec)`` (pickled), then each
    frame of the sender as ``("frame", monotonic seconds, bytes)``; the first
    frame, the spec, goes at the start. A frame not written to a child (it had
    ended) is recorded all the same."""
    import pickle

    from dask_otel_spans.export_process import ExportProcess

    out = open(path, "wb")
    lock = threading.Lock()
    launch, encode = ExportProcess.launch, ExportProcess._encode

    def write(record: tuple) -> None:
        with lock:
            pickle.dump(record, out, protocol=pickle.HIGHEST_PROTOCOL)
            out.flush()

    def recorded_launch(self, *args, **kwargs):
        write(("spec", self.spec))
        return launch(self, *args, **kwargs)

    def recorded_encode(self, batch):
        frame = encode(self, batch)
        write(("frame", time.monotonic(), frame))
        return frame

    ExportProcess.launch, ExportProcess._encode = recorded_launch, recorded_encode


def dask_setup(scheduler):
    gc.callbacks.append(_gc_clock)
    if os.environ.get(FRAMES_VARIABLE):
        record_child_frames(os.environ[FRAMES_VARIABLE])
    if os.environ.get(RECORDS_VARIABLE):
        plugin = OTelSpansPlugin(export_process=True,
                                 providers="bench_preload:child_providers")
    else:
        tracer_provider, meter_provider = _providers()
        plugin = OTelSpansPlugin(tracer_provider=tracer_provider,
                                 meter_provider=meter_provider)
    plugin.pause_clock = gc_cpu_of_this_thread
    scheduler.add_plugin(plugin)


def stats(dask_scheduler) -> dict:
    """run_on_scheduler: the plugin's event-loop figures and the export latencies."""
    plugin = dask_scheduler.plugins.get("otel-spans")
    _read_records()
    metrics = _metric_figures(plugin)
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
        "metric_updates": metrics["metric_updates"],
        "metric_sdk_calls": metrics["metric_sdk_calls"],
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
        "reported_end_skew": list(REPORTED_END_SKEW),
        "plugin_source": os.path.dirname(os.path.abspath(dask_otel_spans.__file__)),
    }


#: the export process's cumulative figures when the benchmark reset the plugin's
_CHILD_BASE: dict[str, float] = {}


def _child_figure(plugin, name: str) -> float:
    return plugin.export_process.child_stats.get(name, 0) - _CHILD_BASE.get(name, 0)


def _metric_figures(plugin) -> dict:
    if plugin is None:
        return {"metric_updates": 0, "metric_sdk_calls": 0}
    if plugin.export_process is not None:
        return {name: _child_figure(plugin, name)
                for name in ("metric_updates", "metric_sdk_calls")}
    return {"metric_updates": plugin.instruments.updates,
            "metric_sdk_calls": plugin.instruments.sdk_calls}


def _cpu_by_place(plugin) -> dict:
    """CPU seconds of the plugin: on the event loop, on its two threads (or, with the
    export process, its sender thread and the export process)."""
    if plugin is None:
        return {}
    if plugin.export_process is not None:
        return {
            "event loop": plugin.total_call_cpu_seconds,
            "sender thread": plugin.export_process.cpu_seconds,
            "export process": _child_figure(plugin, "process_cpu_s"),
        }
    return {
        "event loop": plugin.total_call_cpu_seconds,
        "emitter thread": plugin.emitter.cpu_seconds if plugin.emitter else 0.0,
        "metrics thread": plugin.pump.cpu_seconds if plugin.pump else 0.0,
    }


def _record_hand_over(emitter) -> None:
    """Wrap the emitter's ``emit`` and ``emit_many`` (called on the event loop) to
    note hand-over times (an older plugin, run with --against, may call ``emit``
    only)."""
    if getattr(emitter, "_bench_recording", False):
        return
    emit = emitter.emit

    # (requests are named tuples or, since the plain form, tuples: ids by position)
    def emit_and_record(request) -> None:
        HANDED_OVER[request[1][-1]] = time.time()
        emit(request)

    emitter.emit = emit_and_record
    emit_many = getattr(emitter, "emit_many", None)
    if emit_many is not None:

        def emit_many_and_record(requests) -> None:
            now = time.time()
            for request in requests:
                HANDED_OVER[request[1][-1]] = now
            emit_many(requests)

        emitter.emit_many = emit_many_and_record
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
        if plugin.instruments is not None:
            plugin.instruments.updates = 0
            plugin.instruments.sdk_calls = 0
        if plugin.export_process is not None:
            _CHILD_BASE.update(plugin.export_process.child_stats)
        for worker in {id(w): w for w in (plugin.emitter, plugin.pump)}.values():
            if worker is not None:
                worker.cpu_seconds = 0.0
    _read_records()
    LATENCIES.clear()
    LATENCIES_BY_WORKLOAD.clear()
    REPORTED_END_SKEW.clear()
    HANDED_OVER.clear()
    HAND_OVER_TO_EXPORT_BY_WORKLOAD.clear()
    DONE_TO_HAND_OVER_BY_WORKLOAD.clear()
    GC_PAUSE["max_s"] = 0.0

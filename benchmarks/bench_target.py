"""The export process's CPU per dask span against its floor, in one run: the package
as shipped, and the OpenTelemetry SDK alone making the same OTel spans and metric
points, both delivering OTLP/gRPC to a receiver in another process.

    python benchmarks/bench_replay.py /tmp/nested.msgs --record   # once: a real cluster
    python benchmarks/bench_target.py /tmp/nested.msgs --repeat 5
    python benchmarks/bench_target.py /tmp/nested.msgs --repeat 9 --against /tmp/before

- **package**: the recording (what a scheduler sent its export session on ``nested``:
  one-task leaf spans three levels deep) replayed into an export session whose
  providers the package builds from ``OTEL_*`` (``OTEL_EXPORTER_OTLP_ENDPOINT``, the
  OTLP exporters, its delivery), as the export process builds them.
- **floor**: the OTel spans that replay ends (captured once, before the clock, with an
  in-memory exporter) rebuilt from plain fields as the SDK's ``ReadableSpan`` with one
  shared ``Resource`` and scope and handed to a ``BatchSpanProcessor`` with the SDK's
  OTLP exporter; and as many metric points as the package recorded (its counter
  ``add`` calls over the same series, one duration record per dask span, each in
  the context of the span the package's point has as its exemplar) through a
  ``MeterProvider`` with the SDK's OTLP exporter.

CPU of the whole process (every thread) from the first span to the providers flushed,
per dask span; each side in a fresh process, alternating; best of ``--repeat`` and the
median of the runs' package / floor ratios (``--against``: the package of another tree
too, in the same rounds). The receiver decodes and counts in its own process, which is
not measured; a side whose spans did not all arrive says so.

``--instructions DIR`` counts, instead of CPU time, the instructions each side's process
executes in the same window (valgrind's callgrind, counting switched on and dumped at
the window's edges; every thread and collection): a count of work done, which moves far
less than CPU time on a shared machine. The process runs ~50 times slower there, so the
package's metrics pump hands its sums to the SDK 50 times less often (as often per span
as natively); the per-run lines say how many counter adds the package made.

    python benchmarks/bench_target.py /tmp/nested.msgs --repeat 2 \\
        --against /tmp/before --instructions /tmp/cg
"""
from __future__ import annotations

import argparse
import ast
import gc
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)


def _environ(port: int) -> dict[str, str]:
    # (export timeouts of 600 s, as the floor's: under callgrind a batch takes long
    # to send, and one that timed out would be held past the measured window)
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_METRICS_EXPORTER": "otlp", "OTEL_LOGS_EXPORTER": "none",
            "OTEL_SERVICE_NAME": "dask", "OTEL_EXPORTER_OTLP_TIMEOUT": "600",
            "OTEL_METRIC_EXPORT_TIMEOUT": "600000"}


def _session(environ: dict[str, str], tracer_provider: Any = None,
             meter_provider: Any = None) -> Any:
    from dask_otel_spans.config import PluginConfig
    from dask_otel_spans.export.pipeline import ExportPipeline
    from dask_otel_spans.export.session import ExportSession
    from dask_otel_spans.sdk.providers import Providers
    from dask_otel_spans.transport.providers import build_providers
    from dask_otel_spans.transport.spec import PipelineSpec

    # (a spool of its own: the user's default one may hold other runs' batches)
    config = PluginConfig.from_dask_config(spool_directory=tempfile.mkdtemp())
    providers = (Providers(tracer_provider, meter_provider) if tracer_provider
                 else build_providers(PipelineSpec(config, environ=environ)))
    session = ExportSession(ExportPipeline.build(providers, config), config)
    session.start()
    return session


def _replay(session: Any, recording: dict[str, Any]) -> int:
    """Every message in one batch: the session applies them all before its next
    pass, so that every run hands over the same spans, with all their groups (fed
    batch by batch, faster than they came, a span whose close notice came before
    its groups' messages can be handed over without them, as many as the clock
    decides)."""
    expected = recording["handed_over"]
    session.send([message for batch in recording["batches"] for message in batch])
    deadline = time.monotonic() + 600
    while session.tracker.handed_over < expected and time.monotonic() < deadline:
        session.flush(60, exporters=False)
    session.flush(600)  # (a deadline: under callgrind, sending takes long)
    return int(session.tracker.handed_over)


def _window(mark: str) -> None:
    """With ``--instructions``, the measured window's edges: say ``mark`` and wait
    for the parent to switch callgrind's counting on (``ready``) or dump it
    (``done``)."""
    if os.environ.get(_HANDSHAKE):
        print(mark, flush=True)
        sys.stdin.readline()


_HANDSHAKE = "BENCH_TARGET_HANDSHAKE"
_TIME_SCALE = "BENCH_TARGET_TIME_SCALE"
#: how many times slower a process runs under callgrind, about
CALLGRIND_SLOWDOWN = 50


def _settle() -> None:
    """The export process's garbage collector settings, on both sides."""
    from dask_otel_spans.transport.child import settle_garbage_collector

    settle_garbage_collector()


def capture(recording_path: str, out: str) -> None:
    """Replay once into in-memory exporters: the OTel spans as plain fields, the
    metric series, and the package's counts of SDK calls."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
        InMemorySpanExporter,
    )

    with open(recording_path, "rb") as f:
        recording = pickle.load(f)
    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    meter_provider = MeterProvider(metric_readers=[reader])
    session = _session({}, tracer_provider, meter_provider)
    dask_spans = _replay(session, recording)
    session.pipeline.pump.send_sums()
    session.flush(60)
    figures = session.figures()
    spans = []
    for s in exporter.get_finished_spans():
        parent = s.parent
        spans.append((
            s.name, s.context.trace_id, s.context.span_id, int(s.context.trace_flags),
            None if parent is None else (parent.trace_id, parent.span_id,
                                         parent.is_remote, int(parent.trace_flags)),
            s.start_time, s.end_time, dict(s.attributes or {}),
            [(e.name, dict(e.attributes or {}), e.timestamp) for e in s.events],
            [(link.context.trace_id, link.context.span_id, int(link.context.trace_flags),
              dict(link.attributes or {})) for link in s.links],
            s.status.status_code.value, s.status.description,
        ))
    series: dict[str, list[dict[str, Any]]] = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                # (each point's attributes and its latest exemplar's span: the
                # floor records its points in the same spans' contexts)
                series[metric.name] = [
                    (dict(p.attributes or {}),
                     (p.exemplars[-1].trace_id, p.exemplars[-1].span_id)
                     if getattr(p, "exemplars", None) else None)
                    for p in metric.data.data_points]
    session.stop(10)
    with open(out, "wb") as f:
        pickle.dump({"spans": spans, "series": series, "dask_spans": dask_spans,
                     "counter_adds": figures.metric_sdk_calls}, f)
    print(f"captured {len(spans)} OTel spans of {dask_spans} dask spans, "
          f"{figures.metric_sdk_calls} counter adds over "
          f"{sum(map(len, series.values()))} series")


def run_package(recording_path: str, port: int) -> dict[str, Any]:
    with open(recording_path, "rb") as f:
        recording = pickle.load(f)
    session = _session(_environ(port))
    # (under callgrind, ~50 times slower: the sums go to the SDK as often per span as
    # natively, not 50 times as often)
    session.pipeline.pump.send_interval *= float(os.environ.get(_TIME_SCALE) or 1)
    _settle()
    _window("ready")
    cpu0 = time.process_time()
    dask_spans = _replay(session, recording)
    cpu = time.process_time() - cpu0
    _window("done")
    otel_spans = session.pipeline.ender.otel_spans
    counter_adds = session.figures().metric_sdk_calls
    session.stop(10)
    return {"cpu_s": cpu, "dask_spans": dask_spans, "otel_spans": otel_spans,
            "counter_adds": counter_adds}


def run_floor(capture_path: str, port: int) -> dict[str, Any]:
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import (
        Link,
        NonRecordingSpan,
        SpanContext,
        SpanKind,
        Status,
        StatusCode,
        TraceFlags,
        set_span_in_context,
    )

    def context_of(ids: tuple[int, int] | None) -> Any:
        """A context holding the sampled span ``ids``, whose measurements get it as
        their exemplar, as the package's do (made before the clock)."""
        return None if ids is None else set_span_in_context(NonRecordingSpan(
            SpanContext(ids[0], ids[1], False, TraceFlags(TraceFlags.SAMPLED))))

    with open(capture_path, "rb") as f:
        captured = pickle.load(f)
    endpoint = f"http://127.0.0.1:{port}"
    resource = Resource.create({"service.name": "dask"})
    scope = InstrumentationScope("dask_otel_spans", "0")
    # (export timeouts of 600 s: under callgrind a batch takes long to send, and one
    # that timed out would be dropped, its spans never arriving)
    processor = BatchSpanProcessor(
        OTLPSpanExporter(endpoint=endpoint, insecure=True, timeout=600),
        max_queue_size=max(2048, len(captured["spans"])))
    meter_provider = MeterProvider(resource=resource, metric_readers=[
        PeriodicExportingMetricReader(
            OTLPMetricExporter(endpoint=endpoint, insecure=True, timeout=600),
            export_timeout_millis=600_000)])
    meter = meter_provider.get_meter("dask_otel_spans", "0")
    instruments = {name: (meter.create_histogram(name) if name == "dask.span.duration"
                          else meter.create_counter(name))
                   for name in captured["series"]}
    counters = [(instruments[name], attrs, context_of(exemplar))
                for name, points in captured["series"].items()
                if name != "dask.span.duration" for attrs, exemplar in points]
    histogram = instruments.get("dask.span.duration")
    durations = [attrs for attrs, _ in captured["series"].get("dask.span.duration") or ()]
    durations = durations or [{}]
    # (a dask span's duration has the dask span as its exemplar)
    dask_span_contexts = [context_of((s[1], s[2])) for s in captured["spans"]
                          if "dask.span.id" in s[7]] or [None]
    adds, dask_spans = captured["counter_adds"], captured["dask_spans"]
    _settle()
    _window("ready")
    cpu0 = time.process_time()
    for (name, trace_id, span_id, flags, parent, start, end, attrs, events, links,
         code, description) in captured["spans"]:
        processor.on_end(ReadableSpan(
            name=name,
            context=SpanContext(trace_id, span_id, False, TraceFlags(flags)),
            parent=None if parent is None else SpanContext(
                parent[0], parent[1], parent[2], TraceFlags(parent[3])),
            resource=resource, attributes=attrs,
            events=[Event(n, a, t) for n, a, t in events],
            links=[Link(SpanContext(t, s, True, TraceFlags(f)), a)
                   for t, s, f, a in links],
            kind=SpanKind.INTERNAL, status=Status(StatusCode(code), description),
            start_time=start, end_time=end, instrumentation_scope=scope,
        ))
    for i in range(adds):
        counter, attrs, context = counters[i % len(counters)]
        counter.add(1e-4, attrs, context=context)
    if histogram is not None:
        for i in range(dask_spans):
            histogram.record(0.002, durations[i % len(durations)],
                             context=dask_span_contexts[i % len(dask_span_contexts)])
    # (deadlines, as the package side's: under callgrind, sending takes long)
    processor.force_flush(600_000)
    meter_provider.force_flush(600_000)
    cpu = time.process_time() - cpu0
    _window("done")
    processor.shutdown()
    meter_provider.shutdown()
    return {"cpu_s": cpu, "dask_spans": dask_spans, "otel_spans": len(captured["spans"])}


def _child(side: str, path: str, port: int, tree: str = ROOT,
           instructions: str | None = None) -> dict[str, Any]:
    """One side in a fresh process, this script with ``tree``'s package first on its
    path; with ``instructions`` (a path stem for callgrind's files), under callgrind,
    counting the measured window only (``Ir``, every thread)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tree, HERE, *sys.path])}
    env = {k: v for k, v in env.items() if not k.startswith("OTEL_")}
    command = [sys.executable, __file__, path, "--one", side, "--port", str(port)]
    if instructions is None:
        out = subprocess.run(command, env=env, cwd=HERE, capture_output=True, text=True)
        if out.returncode:
            raise RuntimeError(f"{side} failed:\n{out.stderr[-3000:]}")
        figures: dict[str, Any] = ast.literal_eval(out.stdout.strip().splitlines()[-1])
        return figures
    from bench_account import callgrind, callgrind_totals, callgrind_wrapper

    env[_HANDSHAKE] = "1"
    env[_TIME_SCALE] = str(CALLGRIND_SLOWDOWN)
    proc = subprocess.Popen([*callgrind_wrapper(instructions), *command], env=env,
                            cwd=HERE, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        mark = line.strip()
        if mark == "ready":
            callgrind(proc.pid, "--instr=on")
        elif mark == "done":
            callgrind(proc.pid, "--dump")
            callgrind(proc.pid, "--instr=off")
        else:
            continue
        proc.stdin.write("\n")
        proc.stdin.flush()
    if proc.wait():
        raise RuntimeError(f"{side} failed under callgrind")
    figures = ast.literal_eval(lines[-1].strip())
    figures["instructions"] = callgrind_totals(instructions, proc.pid).get("Ir", 0)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", help="the recording (bench_replay.py --record)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--instructions", metavar="DIR",
                        help="count instructions under valgrind's callgrind (files in "
                             "DIR; ~50 times slower) instead of CPU time")
    parser.add_argument("--against", metavar="TREE",
                        help="also the package of another source tree (a git worktree), "
                             "in the same rounds")
    parser.add_argument("--one", choices=("package", "floor"), help=argparse.SUPPRESS)
    parser.add_argument("--capture", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.capture:
        capture(args.path, args.capture)
        return 0
    if args.one == "package":
        print(repr(run_package(args.path, args.port)))
        return 0
    if args.one == "floor":
        print(repr(run_floor(args.path, args.port)))
        return 0
    from bench_between import ReceiverProcess

    captured = args.path + ".capture"
    subprocess.run([sys.executable, __file__, args.path, "--capture", captured],
                   check=True, cwd=HERE,
                   env={**os.environ,
                        "PYTHONPATH": os.pathsep.join([ROOT, HERE, *sys.path])})
    receiver = ReceiverProcess()
    sides = [("package", args.path, ROOT), ("floor", captured, ROOT)]
    if args.against:
        sides.insert(1, ("before", args.path, os.path.abspath(args.against)))
    runs: dict[str, list[float]] = {side: [] for side, _, _ in sides}
    stem = None
    if args.instructions:
        os.makedirs(args.instructions, exist_ok=True)
        stem = os.path.join(os.path.abspath(args.instructions), "cg")
    unit = "instructions" if stem else "µs of CPU"
    try:
        for i in range(args.repeat):
            # (the package sides in turn first: neither always runs after the floor)
            order = sides if i % 2 == 0 or not args.against else [sides[1], sides[0],
                                                                   sides[2]]
            for side, path, tree in order:
                received = receiver.counts()["spans"]
                figures = _child("package" if side == "before" else side, path,
                                 receiver.port, tree, stem and f"{stem}-{side}-{i}")
                arrived = receiver.counts()["spans"] - received
                per_span = (figures["instructions"] if stem else figures["cpu_s"] * 1e6
                            ) / max(1, figures["dask_spans"])
                runs[side].append(per_span)
                note = ("" if arrived >= figures["otel_spans"] else
                        f" ({arrived} of {figures['otel_spans']} OTel spans arrived)")
                if "counter_adds" in figures:  # (the floor makes the capture's number)
                    note += f" ({figures['counter_adds']} counter adds)"
                print(f"  run {i + 1}, {side}: {per_span:.1f} {unit} per dask span"
                      f"{note}", flush=True)
    finally:
        receiver.stop()
    gc.collect()
    for side, values in runs.items():
        print(f"{side}: {min(values):.1f} {unit} per dask span, best of {args.repeat}"
              f" (median {statistics.median(values):.1f})")
    floor = runs["floor"]
    for side in [s for s in runs if s != "floor"]:
        ratios = [p / f for p, f in zip(runs[side], floor)]
        print(f"{side} / floor: {min(runs[side]) / min(floor):.2f} of the best runs; "
              f"median of the runs' ratios {statistics.median(ratios):.2f} "
              f"({min(ratios):.2f}-{max(ratios):.2f}) (target: at most 1.3)")
    return 0

if __name__ == "__main__":
    sys.exit(main())

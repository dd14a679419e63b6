"""What zero-code (``DaskInstrumentor``) costs: the client per submission, and the
scheduler for the links of bare submissions.

    python benchmarks/bench_zero_code.py              # both parts
    python benchmarks/bench_zero_code.py --quick      # smoke run
    python benchmarks/bench_zero_code.py --parts micro

1. micro, measured where it runs (best of ``--repeat``, CPU of the calling thread):
   the instrumentor's wrapper of ``Client._graph_to_futures`` around a no-op, against
   the no-op, with no OTel span current, with one, and with one and baggage: the
   client's added cost per submission. And the scheduler side's pieces of a link: the
   forwarder's pass over a one-task bare graph (``collect_links``), and the
   translation of a span with 128 links (the export side's).
2. processes: a real ``dask scheduler`` (the plugin with its export process, as
   ``bench_scheduler.py --export-process``) and two ``dask worker`` processes; a client
   makes one-task submissions, each under an OTel span of its own (a distinct caller),
   instrumented (each graph links the default span to its caller) and not (no links),
   in alternating rounds: the plugin's own CPU on the event loop per submission and as
   a share of the scheduler process's CPU, the export process's CPU per submission, and
   the client process's CPU per submission. Whole-process figures on a shared machine
   move by tens of percent between rounds.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_preload  # noqa: E402
from bench_scheduler import Cluster, inc, wait_until_plugin_idle  # noqa: E402
from opentelemetry import baggage, trace  # noqa: E402
from opentelemetry import context as otel_context  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags  # noqa: E402

from dask_otel_spans import names  # noqa: E402
from dask_otel_spans.instrumentation import (  # noqa: E402
    DaskInstrumentor,
    _carrying_callers,
)


def _best_per_call(fn: Any, calls: int, repeat: int) -> float:
    """Best CPU seconds per call of ``fn()`` over ``repeat`` runs of ``calls``."""
    best = float("inf")
    for _ in range(repeat):
        start = time.thread_time()
        for _ in range(calls):
            fn()
        best = min(best, (time.thread_time() - start) / calls)
    return best


def _caller(span_id: int) -> NonRecordingSpan:
    return NonRecordingSpan(SpanContext(0x0AF7651916CD43DD8448EB211C80319C, span_id,
                                        is_remote=False,
                                        trace_flags=TraceFlags(TraceFlags.SAMPLED)))


def micro(calls: int, repeat: int) -> dict[str, float]:
    def submit(self: Any, *args: Any, **kwargs: Any) -> None:
        return None

    wrapped = _carrying_callers(submit)
    out = {}
    base = _best_per_call(lambda: submit(None), calls, repeat)
    out["no span current"] = _best_per_call(lambda: wrapped(None), calls, repeat) - base
    with trace.use_span(_caller(7)):
        out["a span current"] = (_best_per_call(lambda: wrapped(None), calls, repeat)
                                 - base)
        token = otel_context.attach(baggage.set_baggage("tenant", "acme"))
        out["a span and baggage"] = (_best_per_call(lambda: wrapped(None), calls, repeat)
                                     - base)
        otel_context.detach(token)
    print("client: the instrumentor's added CPU per submission (wrapper around a no-op "
          f"against the no-op, best of {repeat} x {calls:,})")
    for case, seconds in out.items():
        print(f"  {case:<22} {seconds * 1e6:7.2f} µs")
    out.update(_scheduler_pieces(calls, repeat))
    return out


def _scheduler_pieces(calls: int, repeat: int) -> dict[str, float]:
    from dask_otel_spans.export.ender import HandOver, SpanEnder
    from dask_otel_spans.export.writers import span_writer
    from dask_otel_spans.scheduler.graphs import collect_links

    carrier = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    key = ("bare", 0)
    callers = {key: carrier}

    def one_graph() -> None:
        links: dict = {}
        for _ in collect_links([key], callers, None, None, {}, links, "d"):
            pass

    forward = _best_per_call(one_graph, calls, repeat)
    ender = SpanEnder(span_writer(TracerProvider(), owned=True))
    root = str(uuid.uuid4())
    headers = tuple(
        {"traceparent": f"00-0af7651916cd43dd8448eb211c80319c-{i + 1:016x}-01"}
        for i in range(names.MAX_SPAN_LINKS))

    def emit(links: tuple) -> None:
        fields, _ = ender.translate(HandOver(
            (names.DEFAULT_SPAN_TAG,), (root,), {}, None, 2.0, True, "idle", 1.0, 2.0,
            links=links))
        ender.export(fields)

    n = max(calls // 100, 10)
    with_links = _best_per_call(lambda: emit(headers), n, repeat)
    without = _best_per_call(lambda: emit(()), n, repeat)
    print("scheduler: the forwarder's pass over a one-task bare graph "
          f"{forward * 1e6:.2f} µs; a span's translation and SDK calls with "
          f"{names.MAX_SPAN_LINKS} links {with_links * 1e6:.0f} µs, without "
          f"{without * 1e6:.0f} µs (export side)")
    return {"forward one bare graph": forward, "emit with 128 links": with_links,
            "emit without links": without}


def _round(cluster: Cluster, instrumented: bool, n: int, tracer: Any) -> dict[str, float]:
    client = cluster.client
    client.run_on_scheduler(bench_preload.reset)
    instrumentor = DaskInstrumentor()
    if instrumented:
        instrumentor.instrument()
    tag = uuid.uuid4().hex[:8]
    sched0, export0, client0 = cluster.cpu(), cluster.export_cpu(), time.process_time()
    try:
        futures = []
        for i in range(n):
            with tracer.start_as_current_span("request"):
                futures.append(client.submit(inc, i, key=f"bare{tag}-{i}"))
        client.gather(futures)
        client_cpu = time.process_time() - client0
    finally:
        if instrumented:
            instrumentor.uninstrument()
    del futures
    stats = wait_until_plugin_idle(client)
    return {
        "loop_us": stats["cpu_by_place"].get("event loop", 0.0) / n * 1e6,
        "scheduler_us": (cluster.cpu() - sched0) / n * 1e6,
        "export_us": (cluster.export_cpu() - export0) / n * 1e6,
        "client_us": client_cpu / n * 1e6,
    }


def processes(rounds: int, n: int) -> dict[str, list[dict[str, float]]]:
    cluster = Cluster(True, workers=2, threads=2, export_process=True)
    tracer = TracerProvider().get_tracer("bench")
    results: dict[str, list[dict[str, float]]] = {"links": [], "no links": []}
    try:
        _round(cluster, False, min(n, 200), tracer)  # (warm-up)
        for i in range(rounds):
            order = (True, False) if i % 2 == 0 else (False, True)
            for instrumented in order:
                figures = _round(cluster, instrumented, n, tracer)
                results["links" if instrumented else "no links"].append(figures)
    finally:
        cluster.close()
    print(f"processes: {n:,} one-task submissions per round, each under its own span; "
          f"medians of {rounds} rounds per side")
    print(f"  {'':<10} {'plugin on loop':>15} {'share':>7} {'scheduler':>10} "
          f"{'export proc':>12} {'client':>9}   (µs per submission)")
    for side, rows in results.items():
        loop = statistics.median(r["loop_us"] for r in rows)
        sched = statistics.median(r["scheduler_us"] for r in rows)
        share = statistics.median(r["loop_us"] / r["scheduler_us"] for r in rows)
        export = statistics.median(r["export_us"] for r in rows)
        client = statistics.median(r["client_us"] for r in rows)
        print(f"  {side:<10} {loop:15.1f} {share:7.2%} {sched:10.0f} {export:12.1f} "
              f"{client:9.0f}")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument("--parts", default="micro,processes")
    parser.add_argument("--calls", type=int, default=None)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--submissions", type=int, default=None)
    args = parser.parse_args(argv)
    parts = set(args.parts.split(","))
    print(f"machine: {os.cpu_count()} cores")
    if "micro" in parts:
        micro(args.calls or (2000 if args.quick else 50_000), args.repeat)
    if "processes" in parts:
        processes(args.rounds or (1 if args.quick else 4),
                  args.submissions or (100 if args.quick else 2000))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The ender's export of one-task dask spans through each span writer
(``dask_otel_spans/export/writers.py``): the tracer API against spans built directly,
with the benchmark's providers (``bench_preload.batch_providers``: a batch span
processor, exporters that discard).

    python benchmarks/bench_writers.py --spans 4000 --repeat 7

Per dask span: its OTel span (below a client's span, the attributes ``nested``'s leaves
get) and one prefix span, as ``SpanEnder.export`` ends them. CPU of the whole process
(the batch processor's thread included, after a flush), per dask span, best of
``--repeat`` runs, the two writers in alternating runs, each run a fresh provider.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from bench_preload import NullSpanExporter, batch_providers  # noqa: E402
from opentelemetry.trace import TraceFlags  # noqa: E402

from dask_otel_spans.export.ender import SpanEnder  # noqa: E402
from dask_otel_spans.export.traces import PrefixSpanFields, SpanFields  # noqa: E402
from dask_otel_spans.export.writers import ApiWriter, DirectWriter  # noqa: E402
from dask_otel_spans.protocol.propagation import ChainIds, prefix_span_id  # noqa: E402

ACTIVITIES = ("thread-cpu", "thread-noncpu", "executor", "other", "memory-read",
              "disk-read", "transfer", "idle or other spans")
WRITERS = {"api": ApiWriter, "direct": lambda provider: DirectWriter(
    provider.get_tracer("dask_otel_spans"))}


def one_task_spans(spans: int) -> list[SpanFields]:
    """Fields of ``spans`` one-task dask spans, each below a client's span."""
    out = []
    now = time.time_ns()
    for i in range(spans):
        dask_id = str(uuid.uuid4())
        metrics = {f"dask.metrics.{a}.seconds": 0.0001 for a in ACTIVITIES}
        ids = ChainIds(uuid.uuid4().int, uuid.UUID(dask_id).int & (2**64 - 1), 1 + i,
                       TraceFlags(TraceFlags.SAMPLED), None)
        prefix = PrefixSpanFields(
            "inc", prefix_span_id(dask_id, "inc"), now, now + 1_000_000,
            {"dask.task.prefix": "inc", "dask.task_group.count": 1,
             "dask.task_group.task_count": 1, "dask.task_group.nbytes_total": 28,
             **metrics})
        out.append(SpanFields(
            f"leaf-{i}", ids, now, now + 2_000_000,
            {"dask.span.name": ["nested", "mid", f"leaf-{i}"], "dask.span.id": dask_id,
             "dask.span.task_count": 1, "dask.span.erred_count": 0,
             "dask.span.nbytes_total": 28, "dask.span.task_duration": 0.001,
             "dask.span.active_cpu_seconds": 0.004, "dask.span.close_reason": "client",
             **metrics},
            None, [prefix]))
    return out


def run(writer: str, spans: int) -> float:
    """CPU µs per dask span of one run of ``writer``."""
    tracer_provider, meter_provider = batch_providers(NullSpanExporter())
    ender = SpanEnder(WRITERS[writer](tracer_provider))
    fields = one_task_spans(spans)
    start = time.process_time()
    for f in fields:
        ender.export(f)
    tracer_provider.force_flush()
    cpu = time.process_time() - start
    tracer_provider.shutdown()
    meter_provider.shutdown()
    return cpu / spans * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=4000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args(argv)
    best = {name: float("inf") for name in WRITERS}
    for _ in range(args.repeat):
        for name in WRITERS:
            best[name] = min(best[name], run(name, args.spans))
    for name, value in best.items():
        print(f"{name}: {value:.1f} µs of CPU per one-task dask span (2 OTel spans), "
              f"best of {args.repeat}")
    print(f"direct / api: {best['direct'] / best['api']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

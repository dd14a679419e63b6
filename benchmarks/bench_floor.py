"""The floor of the export process's cost per span: the OpenTelemetry SDK alone making
what the export process makes for one dask span, with the benchmark's providers
(``bench_preload.batch_providers``: a batch span processor, a periodic metric reader;
exporters that discard), nothing of this package in the loop.

    python benchmarks/bench_floor.py --metric-calls 24     # per span, as measured

Per span: one OTel span with the attributes a dask span gets (its name, id, counts,
times and a roll-up of 8 activities), one child span per task prefix with the
attributes a prefix span gets, and ``--metric-calls`` counter adds / histogram records
with the attribute sets the package's instruments use (span name, prefix, activity,
unit), each span of its own name as ``small``'s are. CPU of the whole process (the
batch processor's and the reader's threads included, after a flush), per span.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_preload import NullSpanExporter, batch_providers  # noqa: E402
from opentelemetry.context import Context  # noqa: E402
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, set_span_in_context  # noqa: E402

ACTIVITIES = ("thread-cpu", "thread-noncpu", "executor", "other", "memory-read",
              "disk-read", "transfer", "idle or other spans")


def floor(spans: int, prefixes: int, metric_calls: int) -> float:
    tracer_provider, meter_provider = batch_providers(NullSpanExporter())
    tracer = tracer_provider.get_tracer("floor")
    meter = meter_provider.get_meter("floor")
    counter = meter.create_counter("dask.span.activity.duration", unit="s")
    histogram = meter.create_histogram("dask.span.duration", unit="s")
    # (the ids are made before the clock starts: the export process gets them)
    dask_ids = [str(uuid.uuid4()) for _ in range(spans)]
    trace_ids = [uuid.uuid4().int for _ in range(spans)]
    start = time.process_time()
    now = time.time_ns()
    for i in range(spans):
        dask_id = dask_ids[i]
        name = ("small", f"step-{i}")
        attributes = {"dask.span.name": list(name), "dask.span.id": dask_id,
                      "dask.span.task_count": 2, "dask.span.erred_count": 0,
                      "dask.span.nbytes_total": 56, "dask.span.task_duration": 0.001,
                      "dask.span.active_cpu_seconds": 0.004,
                      "dask.span.close_reason": "idle"}
        attributes.update({f"dask.metrics.{a}.seconds": 0.0001 for a in ACTIVITIES})
        parent = set_span_in_context(NonRecordingSpan(SpanContext(
            trace_ids[i], 1 + i, True, TraceFlags(TraceFlags.SAMPLED))), Context())
        span = tracer.start_span(name[-1], context=parent, attributes=attributes,
                                 start_time=now)
        child_ctx = set_span_in_context(span)
        for p in range(prefixes):
            prefix = f"inc{p}"
            child = tracer.start_span(prefix, context=child_ctx, start_time=now,
                                      attributes={"dask.task.prefix": prefix,
                                                  "dask.task_group.count": 1,
                                                  "dask.task_group.task_count": 2,
                                                  "dask.task_group.nbytes_total": 56,
                                                  "dask.metrics.thread-cpu.seconds": 1e-4})
            child.end(end_time=now + 1000)
        span.end(end_time=now + 2000)
        for m in range(metric_calls - 1):
            counter.add(0.0001, {"dask.span.name": name[-1], "dask.task.prefix": "inc",
                                 "dask.activity": ACTIVITIES[m % len(ACTIVITIES)],
                                 "dask.context": "execute"})
        histogram.record(0.002, {"dask.span.name": name[-1]})
    tracer_provider.force_flush()
    meter_provider.force_flush()
    cpu = time.process_time() - start
    tracer_provider.shutdown()
    meter_provider.shutdown()
    return cpu / spans


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=3000)
    parser.add_argument("--prefixes", type=int, default=1)
    parser.add_argument("--metric-calls", type=int, default=24)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    best = min(floor(args.spans, args.prefixes, args.metric_calls)
               for _ in range(args.repeat))
    print(f"floor: {best * 1e6:.0f} µs of CPU per dask span (1 span + {args.prefixes} "
          f"prefix span(s), {args.metric_calls} metric calls), best of {args.repeat} "
          f"x {args.spans:,} spans")
    return 0


if __name__ == "__main__":
    sys.exit(main())

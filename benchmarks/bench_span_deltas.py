"""The metrics side of heartbeat deltas alone: ``DaskInstruments.add_span_deltas`` and
the SDK calls of its sums, per span of one name (four keys each: two ``seconds``
activities, ``bytes``, ``count``), on an in-memory reader.

    python benchmarks/bench_span_deltas.py                 # this tree
    python benchmarks/bench_span_deltas.py /tmp/before     # another source tree
"""
from __future__ import annotations

import os
import sys
import time
import uuid

TREE = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else os.path.dirname(
    os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, TREE)

from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402

from dask_otel_spans.export.caps import SeriesCap, SpanNameCap  # noqa: E402
from dask_otel_spans.export.metrics import DaskInstruments  # noqa: E402

SPANS, PER_HEARTBEAT = 20_000, 100


def main() -> None:
    provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    instruments = DaskInstruments(provider.get_meter("bench"), SpanNameCap(None, 1000),
                                  SeriesCap(2000))
    ids = [str(uuid.uuid4()) for _ in range(SPANS)]
    heartbeats = []
    for i in range(0, SPANS, PER_HEARTBEAT):
        deltas, tags, traces = {}, {}, {}
        for span_id in ids[i:i + PER_HEARTBEAT]:
            for activity in ("thread-cpu", "thread-noncpu"):
                deltas[("execute", span_id, "inc", activity, "seconds")] = 0.01
            deltas[("execute", span_id, "inc", "memory-read", "bytes")] = 10
            deltas[("execute", span_id, "inc", "disk-read", "count")] = 1
            tags[span_id] = ("load",)
            traces[span_id] = (uuid.UUID(span_id).int, 5, 1)
        heartbeats.append((deltas, tags, traces))
    cpu = time.process_time()
    for deltas, tags, traces in heartbeats:
        instruments.add_span_deltas(deltas, tags, traces)
        instruments.send()
    cpu = time.process_time() - cpu
    print(f"{TREE}: {cpu / SPANS * 1e6:.1f} µs of CPU per span (4 keys)")


if __name__ == "__main__":
    main()

"""The holding span exporter's hand-over of a batch: what checking for a span that
cannot be encoded costs the usual path (nothing is checked until the batch's
encoding fails), and what a batch with one such span costs (encoded again span by
span, that span left out).

    python benchmarks/bench_unencodable.py --repeat 9

Batches of 512 spans (the batch span processor's default) with 10 attributes each;
alternating runs of: the batch's encoding handed over as before this check existed
(``_hand_over`` with ``SpanEncoding.request``), the exporter's ``export`` (the
check), and ``export`` of a batch with one span whose end is 1e15 s. CPU per span,
best of ``--repeat``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan  # noqa: E402
from opentelemetry.trace import SpanContext, TraceFlags  # noqa: E402

from dask_otel_spans.sdk import holding  # noqa: E402
from dask_otel_spans.sdk.health import ExportHealth  # noqa: E402

BATCH = 512
START = 1_700_000_000_000_000_000


class Held:
    def hold(self, signal: str, payload: bytes, items: int) -> None:
        self.last = payload


def spans(bad: bool) -> list[ReadableSpan]:
    resource = Resource.create({"service.name": "dask"})
    out = [ReadableSpan(
        f"span-{i}", SpanContext(1, i + 1, False, TraceFlags(1)), resource=resource,
        start_time=START + i, end_time=START + i + 10**9,
        attributes={f"dask.attribute.{k}": (k * 1.5 if k % 2 else f"value {k}")
                    for k in range(10)})
        for i in range(BATCH)]
    if bad:
        out[BATCH // 2]._end_time = int(1e15 * 1e9)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--batches", type=int, default=40)
    args = parser.parse_args()
    held = Held()
    exporter = holding.HoldingSpanExporter(held, ExportHealth("traces", "nowhere"))  # type: ignore[arg-type]
    good, with_bad = spans(False), spans(True)
    import logging
    logging.getLogger("dask_otel_spans").setLevel(logging.CRITICAL)

    def before() -> None:
        holding._hand_over(held, exporter.health, exporter.encoding.request,  # type: ignore[arg-type]
                           good, len(good))

    runs = {"before (no check)": before,
            "export (the check)": lambda: exporter.export(good),
            "export, one span of 1e15 s": lambda: exporter.export(with_bad)}
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(args.repeat):
        for name, run in runs.items():
            t0 = time.process_time()
            for _ in range(args.batches):
                run()
            per_span = (time.process_time() - t0) / (args.batches * BATCH) * 1e6
            best[name] = min(best[name], per_span)
    for name, value in best.items():
        print(f"{name}: {value:.2f} µs of CPU per span (best of {args.repeat})")


if __name__ == "__main__":
    main()

"""OTLP span encoding: the SDK's encoder (``encode_spans(...).SerializeToString()``, what
its OTLP exporters send) against the package's (``dask_otel_spans/sdk/otlpspans.py``,
the same bytes); and the file exporter's OTLP/JSON line, protobuf's JSON printer of the
SDK's request against the package's (the same keys and values), on the OTel spans a
replay of a recording ends.

    python benchmarks/bench_target.py /tmp/nested.msgs --repeat 1   # makes .capture
    python benchmarks/bench_encoding.py /tmp/nested.msgs.capture --repeat 7

The spans are rebuilt from the capture as ``ReadableSpan``s with one shared resource
and scope (as the export process has them), cut into batches of 512 (the batch span
processor's default), encoded by each side in alternating runs of the same process;
CPU per OTel span, best of ``--repeat``. Every run checks that both sides' bytes (and
JSON documents) are equal.
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from opentelemetry.exporter.otlp.proto.common.trace_encoder import (  # noqa: E402
    encode_spans,
)
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import Event, ReadableSpan  # noqa: E402
from opentelemetry.sdk.util.instrumentation import InstrumentationScope  # noqa: E402
from opentelemetry.trace import (  # noqa: E402
    Link,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
)

from dask_otel_spans.sdk.otlpjson import to_otlp_json  # noqa: E402
from dask_otel_spans.sdk.otlpspans import SpanEncoding, SpanJsonEncoding  # noqa: E402

BATCH = 512


def rebuild(capture_path: str) -> list[ReadableSpan]:
    """The captured spans as the SDK's ``ReadableSpan``s, one resource and scope."""
    with open(capture_path, "rb") as f:
        captured = pickle.load(f)
    resource = Resource.create({"service.name": "dask"})
    scope = InstrumentationScope("dask_otel_spans", "0")
    return [ReadableSpan(
        name=name, context=SpanContext(trace_id, span_id, False, TraceFlags(flags)),
        parent=None if parent is None else SpanContext(
            parent[0], parent[1], parent[2], TraceFlags(parent[3])),
        resource=resource, attributes=attrs,
        events=[Event(n, a, t) for n, a, t in events],
        links=[Link(SpanContext(t, s, True, TraceFlags(f)), a) for t, s, f, a in links],
        kind=SpanKind.INTERNAL, status=Status(StatusCode(code), description),
        start_time=start, end_time=end, instrumentation_scope=scope,
    ) for (name, trace_id, span_id, flags, parent, start, end, attrs, events, links,
           code, description) in captured["spans"]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("capture", help="bench_target.py's <recording>.capture")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args(argv)
    spans = rebuild(args.capture)
    batches = [spans[i:i + BATCH] for i in range(0, len(spans), BATCH)]
    encoding, json_encoding = SpanEncoding(), SpanJsonEncoding()
    sides = {
        "sdk": lambda batch: encode_spans(batch).SerializeToString(),
        "package": encoding.request,
        "sdk json": lambda batch: json.dumps(to_otlp_json(encode_spans(batch)),
                                             separators=(",", ":")),
        "package json": lambda batch: json.dumps(json_encoding.request(batch),
                                                 separators=(",", ":")),
    }
    best: dict[str, float] = {}
    for _ in range(args.repeat):
        out = {}
        for side, encode in sides.items():
            cpu0 = time.process_time()
            out[side] = [encode(batch) for batch in batches]
            per_span = (time.process_time() - cpu0) / len(spans) * 1e6
            best[side] = min(best.get(side, float("inf")), per_span)
        if out["sdk"] != out["package"] or out["sdk json"] != out["package json"]:
            print("the encodings differ")
            return 1
    attributes = sum(len(s.attributes or ()) for s in spans) / len(spans)
    print(f"{len(spans)} OTel spans, {attributes:.1f} attributes each, "
          f"{sum(map(len, out['sdk']))} bytes, equal on both sides")
    for side, per_span in best.items():
        print(f"{side}: {per_span:.1f} µs of CPU per OTel span, best of {args.repeat}")
    print(f"package / sdk: {best['package'] / best['sdk']:.2f}; OTLP/JSON lines "
          f"{best['package json'] / best['sdk json']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

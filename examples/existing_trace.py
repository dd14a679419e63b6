"""A workflow inside an existing application trace: the application's own OTel span is
the parent of the dask spans, and client-side work inside a dask span lands inside it.

    python examples/existing_trace.py [ADDRESS]

The application configures its own tracer provider as usual (here: the SDK, OTLP when
OTEL_EXPORTER_OTLP_ENDPOINT is set, else one line per span on the console); the
scheduler exports the dask spans into the same trace. With nothing set, the console
shows the application's spans ("handle request", and "store result" whose parent is
the dask span) and the embedded default's files hold the dask spans of that trace.
"""
from __future__ import annotations

import os
import sys

import dask.array as da
from _cluster import connect
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

from dask_otel_spans import span


def app_tracer_provider() -> TracerProvider:
    provider = TracerProvider()
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter,
        )

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    else:
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter(
            formatter=one_line)))
    return provider


def one_line(span: ReadableSpan) -> str:
    """A span of the application's, as the console shows it."""
    parent = f"{span.parent.span_id:016x}" if span.parent else "none"
    return (f"application span {span.name!r}: trace {span.context.trace_id:032x} "
            f"span {span.context.span_id:016x} parent {parent}\n")


def main(address: str | None = None) -> None:
    provider = app_tracer_provider()
    tracer = provider.get_tracer("my-application")
    with connect(address):
        with tracer.start_as_current_span("handle request") as request:
            with span("request analytics") as dask_id:
                result = da.ones((1000, 1000), chunks=250).sum().compute()
                with tracer.start_as_current_span("store result"):
                    pass  # e.g. an instrumented HTTP or database call
    provider.shutdown()
    ctx = request.get_span_context()
    print(f"done: trace {ctx.trace_id:032x} parent {ctx.span_id:016x} "
          f"dask span {dask_id} result {result}")


if __name__ == "__main__":
    main(*sys.argv[1:])

"""Quickstart: a workflow in nested spans, where its data went, and its span tree
read back from the embedded default's files.

    python examples/quickstart.py [ADDRESS] [--output-dir DIR]

Without ADDRESS: a LocalCluster with the plugins registered, scheduler and workers
(``client.register_plugin(OTelSpansPlugin())`` and ``OTelWorkerPlugin()``, as in
``_cluster.py``), writing OTLP-JSON lines files below DIR (default
``dask-otel-spans``). With ADDRESS: the scheduler there, started with ``--preload
dask_otel_spans``; its own configuration says where data goes (the tree is printed
when that is files this machine can read).

Set OTEL_EXPORTER_OTLP_ENDPOINT (and friends) to send to a collector instead.
"""
from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

import dask.array as da
from _cluster import connect
from opentelemetry import trace

from dask_otel_spans import span, wait_for_export
from dask_otel_spans.cli import span_tree
from dask_otel_spans.reports.sources import read_files, traces_files_of
from dask_otel_spans.sdk.otlpjson import TRACES_FILE


def main(address: str | None = None, output_dir: str | None = None) -> None:
    with connect(address, output_dir=output_dir) as client:
        with span("quickstart"):
            # (inside a span its OTel span is current: the trace this run's spans join)
            trace_id = f"{trace.get_current_span().get_span_context().trace_id:032x}"
            # (persist returns at once: load's tasks run on while reduce's start, so
            # the two spans overlap in the tree; a dask span covers its own tasks)
            with span("load"):
                x = da.random.random((1000, 1000), chunks=250).persist()
            with span("reduce"):
                print("mean:", x.mean().compute())

        # Spans are exported once done, closed and past a short grace period:
        # wait for that, and ask the scheduler's plugin where they went.
        state = wait_for_export(client)
        print("dask spans handed over:", state.handed_over)
        # (what the exporters counted: delivered, failed, still held)
        print(state.outcome("traces"))
        print(state.outcome("metrics"))
    print_span_tree(state.traces_to, trace_id)


def print_span_tree(traces_to: str, trace_id: str) -> None:
    """The span tree of trace ``trace_id``, from the files ``traces_to`` names (the
    scheduler's, and its workers' below it), as ``dask-otel-spans tree DIR`` prints
    them."""
    if not (traces_to.endswith(TRACES_FILE) and os.path.exists(traces_to)):
        print("(no files here to print the span tree from)")
        return
    files = traces_files_of([os.path.dirname(traces_to)])
    # (the files keep earlier runs: this one's trace only)
    spans = [s for s in read_files(files) if s.get("traceId") == trace_id]
    print()
    print(span_tree(files, spans))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="A workflow in nested spans, and its span tree")
    parser.add_argument(
        "address", nargs="?", default=None,
        help="the scheduler's address (tcp://HOST:PORT), started with --preload "
             "dask_otel_spans; default: a LocalCluster with the plugins",
    )
    parser.add_argument(
        "--output-dir", default=None,
        help="the LocalCluster's embedded default directory (default: "
             "otel-spans.output-dir, dask-otel-spans); a remote scheduler writes "
             "where its own configuration says",
    )
    args = parser.parse_args(argv)
    if args.address and ":" not in args.address:
        parser.error(f"{args.address!r} is not a scheduler address (tcp://HOST:PORT); "
                     "the output directory is --output-dir DIR")
    if args.address and args.output_dir:
        parser.error("--output-dir is the LocalCluster's: a remote scheduler writes "
                     "where its own configuration says")
    return args


if __name__ == "__main__":
    args = parse_args()
    main(args.address, args.output_dir)

"""Quickstart: a LocalCluster with the plugins (scheduler and workers), a workflow in
nested spans, and the span tree read back from the embedded default's files.

    python examples/quickstart.py [OUTPUT_DIR]

Set OTEL_EXPORTER_OTLP_ENDPOINT (and friends) to send to a collector instead.
"""
from __future__ import annotations

import sys

import dask.array as da
from distributed import Client, LocalCluster

from dask_otel_spans import OTelSpansPlugin, OTelWorkerPlugin, span, wait_for_export


def main(output_dir: str = "dask-otel-spans") -> None:
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster:
        with Client(cluster) as client:
            client.register_plugin(OTelSpansPlugin(output_dir=output_dir))
            # task code runs in its span's trace: spans and logs made in tasks join it
            client.register_plugin(OTelWorkerPlugin(output_dir=output_dir))

            with span("quickstart"):
                with span("load"):
                    x = da.random.random((1000, 1000), chunks=250).persist()
                with span("reduce"):
                    print("mean:", x.mean().compute())

            # Spans are exported once done, closed and past a short grace period:
            # wait for that, and ask the scheduler's plugin where they went.
            state = wait_for_export(client)
            print("spans exported:", state["exported"])
            print("traces:", state["traces_to"])
            print("metrics:", state["metrics_to"])


if __name__ == "__main__":
    main(*sys.argv[1:])

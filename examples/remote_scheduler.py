"""A workflow against a remote scheduler that runs the plugin:

    dask scheduler --preload dask_otel_spans     # OTEL_* variables say where data goes
    dask worker tcp://SCHEDULER:8786 --preload dask_otel_spans   # optional: task
                                                # code runs in its span's trace
    python examples/remote_scheduler.py tcp://SCHEDULER:8786

Only the client's import changes; the scheduler does the exporting (and each
preloaded worker exports the spans and logs made in its tasks).
"""
from __future__ import annotations

import sys

import dask.array as da
from _cluster import connect

from dask_otel_spans import span


def main(address: str | None = None) -> None:
    with connect(address) as client:
        with span("nightly report"):
            with span("load"):
                x = da.random.random((2000, 2000), chunks=500).persist()
            with span("aggregate"):
                total = x.sum().compute()
            with span("publish"):
                client.submit(round, total, 2).result()
    print("done: nightly report", round(float(total), 2))


if __name__ == "__main__":
    main(*sys.argv[1:])

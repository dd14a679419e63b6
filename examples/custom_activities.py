"""Custom activities with ``context_meter``: your own breakdown of task time, and
metrics in units of your choice, exported like dask's own.

    python examples/custom_activities.py [ADDRESS]

``model-fit`` seconds appear as ``dask.metrics.model-fit.seconds`` on the span and in
``dask.span.activity.time{dask.activity="model-fit"}``; ``rows`` (not a dask unit) in
``dask.span.activity.custom{dask.unit="rows"}``.
"""
from __future__ import annotations

import sys
import time

from _cluster import connect
from distributed.metrics import context_meter

from dask_otel_spans import span


def fit(part: int) -> int:
    with context_meter.meter("load-features"):
        time.sleep(0.01)
    with context_meter.meter("model-fit"):
        time.sleep(0.03)
    context_meter.digest_metric("rows-scored", 500, "rows")
    return part


def main(address: str | None = None) -> None:
    with connect(address) as client:
        with span("training", "fit"):
            client.gather(client.map(fit, range(8)))
    print("done: training/fit")


if __name__ == "__main__":
    main(*sys.argv[1:])

"""Multi-tenant accounting: user and dataset as span tags, metrics filtered by them.

    python examples/multi_tenant.py [ADDRESS]

The ``dask.span.name`` metric attribute is the tags joined with ``/``, so in Prometheus:

    # CPU seconds per tenant
    sum by (dask_span_name) (dask_span_activity_time_seconds_total{dask_activity="thread-cpu"})
    # everything alice ran on the sales dataset
    sum by (dask_activity) (
      dask_span_activity_time_seconds_total{dask_span_name=~"user=alice/dataset=sales/.*"})

With many tenants, cap the label: ``otel-spans.metrics.span-name-depth: 2`` keeps
``user=.../dataset=...`` only, and ``metrics.max-span-names`` bounds the series.
"""
from __future__ import annotations

import sys
import time

from _cluster import connect

from dask_otel_spans import span


def score(row: int, cost: float) -> int:
    time.sleep(cost)
    return row * 2


def main(address: str | None = None) -> None:
    jobs = [("alice", "sales", 0.02), ("bob", "sales", 0.01), ("alice", "logs", 0.005)]
    with connect(address) as client:
        for user, dataset, cost in jobs:
            with span(f"user={user}", f"dataset={dataset}", "score"):
                client.gather(client.map(score, range(10), cost=cost, pure=False))
    print("done:", ", ".join(f"{u}/{d}" for u, d, _ in jobs))


if __name__ == "__main__":
    main(*sys.argv[1:])

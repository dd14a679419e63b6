"""The messages a scheduler's forwarder sends for one ``distributed.span`` block
around a graph of two tasks of a group of their own, done: the export side's input
without a cluster (the memory tests and ``benchmarks/bench_memory.py --side export``)."""
from __future__ import annotations

import uuid

from dask_otel_spans.protocol import events


def block_messages(i: int, at: float, group: int, tags: tuple[str, str], prefix: str,
                   client: str) -> list[events.Message]:
    """Block ``i`` (a new root, as dask makes one each time, and its child ``tags``),
    done at ``at``: its spans, its graph of ``client``, its group of ``prefix``
    running, counted and done, a heartbeat's deltas of it and worker-wide ones."""
    root, leaf = str(uuid.uuid4()), str(uuid.uuid4())
    return [
        events.span_added((root,), tags[:1], at, 2, 2 * i),
        events.span_added((root, leaf), tags, at, 2, 2 * i + 1),
        events.graph_submitted(at, client, [leaf], None, [], []),
        events.group_running(leaf, group, prefix),
        events.group_counts([(leaf, group, 2, 0, 2, 0)]),
        events.span_deltas({("execute", leaf, prefix, activity, "seconds"): 1e-4
                            for activity in ("thread-cpu", "thread-noncpu",
                                             "executor", "other")}),
        events.worker_deltas({("get-data", "serialize", "seconds"): 1e-4}),
        events.group_done(leaf, group, (prefix, at, at + 0.001, 56, 1e-4, 2, 0, 0.0,
                                        0.0)),
    ]

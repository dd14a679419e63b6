"""The export process's sender thread in the scheduler, per span, on a real cluster:
where its CPU goes, and how many bytes cross the pipe; the whole package (client
helper and plugin) of one source tree or two.

    python benchmarks/bench_sender.py                        # 3 nested runs, this tree
    python benchmarks/bench_sender.py --against /tmp/before  # and a git worktree's
                                                             # package, alternating

Each round starts a cluster (``bench_scheduler.Cluster``: a real ``dask scheduler``
with the plugin and its export process, 2 workers x 2 threads) in a fresh
interpreter with the tree first on ``sys.path``, so that the client helper that
makes the annotations and close notices is that tree's too (``bench_scheduler.py
--against`` swaps the scheduler's plugin only). It warms up on a small futures
workload, then times the sender's methods (wrapped on the scheduler, with the
thread's CPU clock) over ``--runs`` nested workloads (10 x 10 x 20 one-task leaf
spans as in ``bench_scheduler.py``) and reports, per span handed over:

- ``cpu``: the sender thread's CPU (what ``ExportProcess.cpu_seconds`` counts);
- ``handle``: taking items off the queue (the metric deltas' copy);
- ``encode``: making a frame of a batch, of which ``dumps`` is ``marshal.dumps``;
- ``write``: the rest of ``settle``, writing frames to the pipe;
- ``bytes``: frame bytes, and ``frames``: frames per 1,000 spans.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench_trees import add_tree_arguments, run_in_tree, runs_by_tree, scale_of

HERE = Path(__file__).resolve().parent
FIGURES = ("cpu", "handle", "encode", "dumps", "write", "bytes", "frames")

_TOTALS: dict[str, float] = {}


def install_probe(dask_scheduler: Any = None) -> bool:
    """Wrap the scheduler's export sender in timers (run on the scheduler)."""
    import marshal

    import dask_otel_spans.wire as wire

    sender = dask_otel_spans_plugin(dask_scheduler).export_process
    totals = _TOTALS
    totals.update(handle=0.0, encode=0.0, dumps=0.0, settle=0.0, bytes=0, frames=0)
    handle, encode, settle = sender.handle, sender._encode, sender.settle
    clock = time.thread_time

    class _TimedMarshal:
        def __getattr__(self, name: str) -> Any:
            return getattr(marshal, name)

        @staticmethod
        def dumps(*args: Any) -> bytes:
            t0 = clock()
            try:
                return marshal.dumps(*args)
            finally:
                totals["dumps"] += clock() - t0

    def timed_handle(item: Any) -> None:
        t0 = clock()
        try:
            handle(item)
        finally:
            totals["handle"] += clock() - t0

    def timed_encode(batch: Any) -> bytes:
        t0 = clock()
        try:
            frame = encode(batch)
        finally:
            totals["encode"] += clock() - t0
        totals["bytes"] += len(frame)
        totals["frames"] += 1
        return frame

    def timed_settle() -> None:
        t0 = clock()
        try:
            settle()
        finally:
            totals["settle"] += clock() - t0

    wire.marshal = _TimedMarshal()
    sender.handle, sender._encode, sender.settle = timed_handle, timed_encode, timed_settle
    return True


def read_probe(dask_scheduler: Any = None) -> dict[str, float]:
    """The timers so far, and the sender's own CPU count (run on the scheduler)."""
    sender = dask_otel_spans_plugin(dask_scheduler).export_process
    return dict(_TOTALS, cpu=sender.cpu_seconds)


def dask_otel_spans_plugin(scheduler: Any) -> Any:
    from dask_otel_spans import names

    return scheduler.plugins[names.PLUGIN_NAME]


def measure(runs: int, a: int, b: int, c: int,
            tree: str | None = None) -> list[dict[str, float]]:
    """Per-span figures of ``runs`` nested workloads on one cluster (whose plugin is
    ``tree``'s, by default this one's)."""
    import bench_scheduler as bench

    cluster = bench.Cluster(True, 2, 2, export_process=True, plugin_tree=tree)
    try:
        client = cluster.client
        bench.futures_workload(client, 4, 10)
        before = bench.wait_until_plugin_idle(client)
        client.run_on_scheduler(install_probe)
        out = []
        # the leaf spans, their ancestors and the span of the gather
        expected = a * b * c + a * b + a + 1
        for _ in range(runs):
            start = client.run_on_scheduler(read_probe)
            bench.nested_workload(client, a, b, c)
            deadline = time.monotonic() + 120
            while True:
                after = bench.wait_until_plugin_idle(client)
                handed = after["handed_over"] - before["handed_over"]
                if handed >= expected or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            end = client.run_on_scheduler(read_probe)
            spans = max(handed, 1)
            before = after
            d = {k: end[k] - start[k] for k in end}
            out.append({
                "spans": spans,
                "cpu": d["cpu"] / spans * 1e6,
                "handle": d["handle"] / spans * 1e6,
                "encode": d["encode"] / spans * 1e6,
                "dumps": d["dumps"] / spans * 1e6,
                "write": (d["settle"] - d["encode"]) / spans * 1e6,
                "bytes": d["bytes"] / spans,
                "frames": d["frames"] / spans * 1000,
            })
        return out
    finally:
        cluster.close()


def run_tree(tree: str, runs: int, a: int, b: int, c: int) -> list[dict[str, float]]:
    """:func:`measure` in a fresh interpreter with ``tree`` first on ``sys.path`` (the
    client helper), and as the cluster's plugin tree."""
    return run_in_tree(tree, "import json, bench_sender; print(json.dumps("
                             f"bench_sender.measure({runs}, {a}, {b}, {c}, {tree!r})))")


def report(label: str, results: list[dict[str, float]]) -> None:
    medians = {k: statistics.median(r[k] for r in results) for k in FIGURES}
    ranges = {k: (min(r[k] for r in results), max(r[k] for r in results))
              for k in FIGURES}
    print(f"{label} ({len(results)} runs of {results[0]['spans']} spans), per span, "
          "median (min-max):")
    for k in FIGURES:
        unit = {"bytes": "bytes", "frames": "per 1,000 spans"}.get(k, "µs")
        lo, hi = ranges[k]
        print(f"   {k:<7} {medians[k]:8.2f} ({lo:.2f}-{hi:.2f}) {unit}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_tree_arguments(parser, rounds=2)
    parser.add_argument("--runs", type=int, default=3,
                        help="nested workloads per round, on one cluster")
    args = parser.parse_args(argv)
    a, b, c = scale_of(args)
    by_round = runs_by_tree(args, str(HERE.parent),
                            lambda tree: run_tree(tree, args.runs, a, b, c))
    trees = list(by_round)
    results = {tree: [run for runs in by_round[tree] for run in runs] for tree in trees}
    for tree in trees:
        report(tree, results[tree])
    if len(trees) == 1:
        return 0
    ratio = statistics.median(results[trees[0]][i]["cpu"] / results[trees[1]][i]["cpu"]
                              for i in range(len(results[trees[0]])))
    print(f"sender CPU per span, median of the paired runs, this tree / {trees[1]}: "
          f"{ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

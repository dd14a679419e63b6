"""The plugin's whole cost to the scheduler process on ``small``, measured in ONE
scheduler process: the plugin is registered and unregistered in turn (its export
process started and ended outside the measured windows), so that both sides of each
pair run in the same process on the same machine minutes apart, not in two processes
whose speeds differ.

    python benchmarks/bench_same_process.py                 # 10 pairs of 300 blocks
    python benchmarks/bench_same_process.py --pairs 4 --spans 100

Per window: the scheduler process's CPU (its CPU-time clock) from the workload's start
to ``--settle`` seconds after its results (7.5 s: plain spans are exported after
``idle-timeout``), per block; the workers' CPU per block as the control. The plugin is
the shipped one with its export process (``bench_preload:memory_child_providers``:
everything translated and handed to the SDK, exporters that discard).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_scheduler import Cluster, futures_workload, small_workload  # noqa: E402

from dask_otel_spans import OTelSpansPlugin, names  # noqa: E402


def _plugin_idle(dask_scheduler) -> bool:
    plugin = dask_scheduler.plugins.get(names.PLUGIN_NAME)
    return plugin is None or plugin.open_span_count == 0


def window(cluster: Cluster, spans: int, per_span: int, settle: float) -> tuple[float, float]:
    """Scheduler and workers CPU per block over one run of ``small``."""
    cpu0, workers0 = cluster.cpu(), cluster.workers_cpu()
    small_workload(cluster.client, spans, per_span)
    time.sleep(settle)
    return ((cluster.cpu() - cpu0) / spans * 1e6,
            (cluster.workers_cpu() - workers0) / spans * 1e6)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--spans", type=int, default=300)
    parser.add_argument("--per-span", type=int, default=2)
    parser.add_argument("--settle", type=float, default=7.5)
    args = parser.parse_args(argv)
    cluster = Cluster(False, workers=2, threads=2)
    client = cluster.client
    ratios, control, own = [], [], []
    try:
        futures_workload(client, 4, 10)  # warm up
        for i in range(args.pairs):
            figures = {}
            for with_plugin in ((True, False) if i % 2 == 0 else (False, True)):
                if with_plugin:
                    client.register_plugin(OTelSpansPlugin(
                        export_process=True, use_global_providers=False,
                        providers="bench_preload:memory_child_providers"))
                    futures_workload(client, 2, 5)  # (its export process is up)
                    time.sleep(args.settle)
                figures[with_plugin] = window(cluster, args.spans, args.per_span,
                                              args.settle)
                if with_plugin:
                    deadline = time.monotonic() + 30
                    while (not client.run_on_scheduler(_plugin_idle)
                           and time.monotonic() < deadline):
                        time.sleep(0.2)
                    client.unregister_scheduler_plugin(names.PLUGIN_NAME)
                time.sleep(1.0)
            (p_cpu, p_workers), (b_cpu, b_workers) = figures[True], figures[False]
            ratios.append(p_cpu / b_cpu)
            control.append(p_workers / b_workers)
            own.append(p_cpu - b_cpu)
            print(f"  pair {i + 1}: scheduler {p_cpu:.0f} / {b_cpu:.0f} µs per block "
                  f"({ratios[-1]:.3f}); workers {control[-1]:.3f}", flush=True)
    finally:
        cluster.close()

    def spread(values: list[float]) -> str:
        low, _, high = statistics.quantiles(values, n=4, method="inclusive")
        return (f"median {statistics.median(values):.3f} (middle half {low:.3f}-"
                f"{high:.3f}, range {min(values):.3f}-{max(values):.3f})")

    print(f"small, {args.spans} blocks x {args.per_span} tasks, {args.pairs} pairs in one "
          f"scheduler process: scheduler CPU plugin / none {spread(ratios)}; workers' "
          f"control {spread(control)}; the difference {statistics.median(own):+.0f} µs "
          "per block (median)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

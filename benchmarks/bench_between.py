"""The scheduler process between clusters: a fresh ``dask scheduler --preload
dask_otel_spans`` against a fresh one without, on ``small``, OTLP to a receiver in
another process that only counts.

    python benchmarks/bench_between.py --pairs 8        # the figures in the README
    python benchmarks/bench_between.py --quick          # smoke run: 1 pair, 30 spans
    python benchmarks/bench_between.py --workload nested --spans 2000 --pairs 3
        # one-task leaf spans three levels deep: the export process as shipped
    python benchmarks/bench_between.py --profiles --workload wide --pairs 8
        # the plugin on both sides: profile.enabled true against false

Each pair starts two clusters one after the other, baseline first in odd pairs and
plugin first in even ones: a ``dask scheduler`` (with ``--preload dask_otel_spans``,
the package as shipped: its export process, providers from ``OTEL_*``, or without it)
and two ``dask worker`` processes of 2 threads. No benchmark preload runs in the
scheduler (``bench_account.py`` and ``bench_scheduler.py`` preload ``bench_clock`` and
``bench_preload``, whose SDK providers live in the scheduler process). Both sides get
the same ``OTEL_*``: traces and metrics over OTLP/gRPC to
:class:`bench_delivery.CountingReceiver`, run in a child process of this one for the
whole benchmark.

Per run, after a warm-up: the ``small`` workload (``--spans`` plain
``distributed.span`` blocks of 2 tasks, a TaskGroup each: ``bench_scheduler``'s
``small_workload``); tasks/s until its results are in; the scheduler process's CPU, and
with its children's (the export process), from the workload's start to ``--settle``
seconds after its results (plain blocks are handed over once idle for 5 s); then, the
window closed, ``wait_for_export`` on the plugin side (the spans delivered), and the
scheduler process's modules, the objects its garbage collector tracks and its threads.
Reported per pair and as medians: plugin / baseline of tasks/s, of the scheduler's CPU
per task and of the scheduler's and its children's CPU per task; and the export
process's CPU as a fraction of the baseline scheduler's. ``--workload nested`` runs
``nested`` instead (``--spans`` one-task leaf spans, 10 x 10 x ``spans // 100``),
``--workload wide`` runs ``wide`` (one span of ``--spans`` one-task child spans, one
graph). ``--profiles``: both sides run the plugin, the "baseline" with
``otel-spans.profile.enabled: false``, the other with ``true``
(``DASK_OTEL_SPANS__PROFILE__ENABLED``); the profile fetcher's coroutines and
requests are reported.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_account import SETTLE_S  # noqa: E402
from bench_delivery import CountingReceiver  # noqa: E402
from bench_scheduler import (  # noqa: E402
    Cluster,
    futures_workload,
    nested_workload,
    small_workload,
    wide_workload,
)

from dask_otel_spans import wait_for_export  # noqa: E402

#: Module prefixes a scheduler process whose export runs in the export process does
#: not import
EXPORT_SIDE = ("opentelemetry.sdk", "google.protobuf", "opentelemetry.exporter",
               "dask_otel_spans.export", "dask_otel_spans.sdk")


def process_counts(dask_scheduler: Any = None) -> dict[str, Any]:
    """run_on_scheduler: the process's modules (all, and those of each prefix of
    :data:`EXPORT_SIDE`), the objects its garbage collector tracks (after a full
    collection), and its threads (Python's, by name; and the system's count)."""
    import gc
    import os
    import sys
    import threading

    modules = list(sys.modules)
    gc.collect()
    plugin = dask_scheduler.plugins.get("otel-spans") if dask_scheduler else None
    fetcher = getattr(plugin, "_profiles", None)
    return {
        "profile_fetches": None if fetcher is None else (fetcher.coroutines,
                                                         fetcher.fetches),
        "modules": len(modules),
        "by_prefix": {p: sum(m == p or m.startswith(p + ".") for m in modules)
                      for p in EXPORT_SIDE},
        "gc_objects": len(gc.get_objects()),
        "threads": sorted(t.name for t in threading.enumerate()),
        "os_threads": len(os.listdir("/proc/self/task")) if os.path.isdir(
            "/proc/self/task") else None,
    }


def _otlp_environ(port: int) -> dict[str, str]:
    return {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_METRICS_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
            "OTEL_EXPORTER_OTLP_INSECURE": "true"}


def _workload(client: Any, workload: str, spans: int) -> int:
    """Run ``workload`` of ``spans`` spans: the tasks it ran."""
    if workload == "nested":
        return nested_workload(client, 10, 10, max(1, spans // 100))
    if workload == "wide":
        return wide_workload(client, spans)
    return small_workload(client, spans, 2)


def one_run(with_plugin: bool, spans: int, settle: float,
            environ: dict[str, str], workload: str = "small",
            profiles: bool = False) -> dict[str, Any]:
    """One fresh cluster, with or without the plugin (``profiles``: the plugin on
    both sides, profiles on or off): its figures."""
    if profiles:
        environ = {**environ,
                   "DASK_OTEL_SPANS__PROFILE__ENABLED": "true" if with_plugin else "false"}
        with_plugin = True
    cluster = Cluster(False, workers=2, threads=2, clock=False, environ=environ,
                      preload="dask_otel_spans" if with_plugin else None)
    try:
        client = cluster.client
        futures_workload(client, 4, 10)  # warm up
        time.sleep(settle)
        if with_plugin:
            wait_for_export(client, timeout=60)
        cpu0, children0 = cluster.cpu(), cluster.export_cpu()
        t0 = time.perf_counter()
        n = _workload(client, workload, spans)
        wall = time.perf_counter() - t0
        time.sleep(settle)
        cpu, children = cluster.cpu() - cpu0, cluster.export_cpu() - children0
        load = os.getloadavg()[0]  # (what else ran on the machine meanwhile)
        delivered = None
        if with_plugin:
            state = wait_for_export(client, timeout=60)
            delivered = (state.handed_over, state.traces_delivered, state.open)
        counts = client.run_on_scheduler(process_counts)
    finally:
        cluster.close()
    return {"tasks/s": n / wall, "cpu/task": cpu / n,
            "tree cpu/task": (cpu + children) / n, "export cpu/task": children / n,
            "delivered": delivered,
            "load": load, **counts}


def _ratios(runs: dict[bool, list[dict[str, Any]]], key: str) -> list[float]:
    return [p[key] / b[key] for b, p in zip(runs[False], runs[True])]


def _median_line(label: str, values: list[float]) -> str:
    return (f"  {label:<38} median {statistics.median(values):.3f} "
            f"(pairs {min(values):.3f}-{max(values):.3f})")


def _pair_line(i: int, base: dict[str, Any], plugin: dict[str, Any]) -> None:
    print(f"  pair {i + 1} ({'baseline' if i % 2 == 0 else 'plugin'} first): tasks/s "
          f"{plugin['tasks/s'] / base['tasks/s']:.3f} ({base['tasks/s']:.0f} / "
          f"{plugin['tasks/s']:.0f}), scheduler CPU "
          f"{plugin['cpu/task'] / base['cpu/task']:.3f}, with children "
          f"{plugin['tree cpu/task'] / base['tree cpu/task']:.3f}; load average "
          f"{base['load']:.1f} / {plugin['load']:.1f}; dask spans handed over, OTel "
          f"spans delivered, open: {plugin['delivered']}; profile coroutines, "
          f"requests: {plugin['profile_fetches']}", flush=True)


def report(runs: dict[bool, list[dict[str, Any]]]) -> None:
    """The medians of the ratios, and each side's modules, objects and threads."""
    print("plugin / baseline:")
    for label, key in (("tasks/s", "tasks/s"),
                       ("scheduler CPU per task", "cpu/task"),
                       ("scheduler + children CPU per task", "tree cpu/task")):
        print(_median_line(label, _ratios(runs, key)))
    print(_median_line("export process CPU, of the baseline's", [
        p["export cpu/task"] / b["cpu/task"] for b, p in zip(runs[False], runs[True])]))
    ratios = _ratios(runs, "tasks/s")
    if len(ratios) > 1:  # (the order's effect: the machine, not the plugin)
        print(f"  tasks/s by order: baseline first median "
              f"{statistics.median(ratios[0::2]):.3f}, plugin first median "
              f"{statistics.median(ratios[1::2]):.3f}")
    for with_plugin in (False, True):
        side = runs[with_plugin]
        last = side[-1]
        print(f"{'plugin' if with_plugin else 'baseline'} (median): "
              f"{statistics.median(r['tasks/s'] for r in side):.0f} tasks/s, scheduler "
              f"CPU {statistics.median(r['cpu/task'] for r in side) * 1e6:.0f} µs per "
              f"task, with children "
              f"{statistics.median(r['tree cpu/task'] for r in side) * 1e6:.0f}")
        print(f"{'plugin' if with_plugin else 'baseline'} scheduler process (median): "
              f"{statistics.median(r['modules'] for r in side):.0f} modules, "
              f"{statistics.median(r['gc_objects'] for r in side):,.0f} objects "
              f"tracked by the collector, "
              f"{statistics.median(r['os_threads'] or 0 for r in side):.0f} threads")
        print(f"  of them: {json.dumps(last['by_prefix'])}")
        print(f"  Python threads: {', '.join(last['threads'])}")


def _receiver_main() -> None:
    """``--receiver``: serve a :class:`CountingReceiver`; print its port, then its
    counts (a JSON line) for each line read."""
    receiver = CountingReceiver()
    print(receiver.port, flush=True)
    for _ in sys.stdin:
        print(json.dumps({"spans": receiver.spans,
                          "trace_requests": receiver.trace_requests,
                          "metric_requests": receiver.metric_requests}), flush=True)
    receiver.stop()


class ReceiverProcess:
    """The counting receiver, in a child process."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__, "--receiver"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())

    def counts(self) -> dict[str, int]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        counts: dict[str, int] = json.loads(self.proc.stdout.readline())
        return counts

    def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--spans", type=int, default=300)
    parser.add_argument("--workload", choices=("small", "nested", "wide"),
                        default="small")
    parser.add_argument("--profiles", action="store_true",
                        help="the plugin on both sides: profiles on against off")
    parser.add_argument("--settle", type=float, default=SETTLE_S,
                        help="seconds after the results during which CPU counts")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 1 pair, 30 spans, 1 s settle")
    parser.add_argument("--receiver", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.receiver:
        _receiver_main()
        return 0
    if args.quick:
        args.pairs, args.spans, args.settle = 1, 30, 1.0
    # (the client's WARNING that a baseline scheduler runs no plugin, once a cluster)
    logging.getLogger("dask_otel_spans").setLevel(logging.ERROR)
    print(f"machine: {os.cpu_count()} cores; {args.workload}: {args.spans} spans; "
          f"{'profiles on / off (the plugin on both sides); ' if args.profiles else ''}"
          f"{args.pairs} pairs of fresh clusters, alternating order; settle "
          f"{args.settle:g} s")
    receiver = ReceiverProcess()
    runs: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    try:
        environ = _otlp_environ(receiver.port)
        for i in range(args.pairs):
            for with_plugin in ((False, True) if i % 2 == 0 else (True, False)):
                runs[with_plugin].append(one_run(with_plugin, args.spans, args.settle,
                                                 environ, args.workload,
                                                 args.profiles))
            _pair_line(i, runs[False][-1], runs[True][-1])
        report(runs)
        print(f"receiver: {json.dumps(receiver.counts())}")
    finally:
        receiver.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

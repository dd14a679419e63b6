"""Where the scheduler's CPU goes with and without the plugin, on the ``small``
workload (300 plain ``distributed.span`` blocks of 2 tasks, one graph each): the
accounting asked for by the cost-of-a-span work.

    python benchmarks/bench_account.py                  # 8 pairs
    python benchmarks/bench_account.py --pairs 2 --spans 60   # quick look
    python benchmarks/bench_account.py --strace          # + system calls (slows both)

Each pair runs a fresh ``dask scheduler`` (``--preload bench_clock`` on both sides;
``--preload bench_preload`` adds the plugin with its export process, as shipped) and
two ``dask worker`` processes, baseline and plugin in alternating order. Per run: tasks/s;
the scheduler process's user and system CPU, per thread by name (``MainThread`` runs
the event loop; threads that ended count in ``ended threads``); its export process;
the garbage collections (per generation) and their CPU; the frames written to the
export process; with ``--strace``, the system calls by name. The plugin side also
reads the plugin's own timed CPU (event loop, sender thread). Reported per span
(µs), as medians over the pairs, both sides and their difference.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_clock  # noqa: E402
import bench_preload  # noqa: E402
from bench_scheduler import (  # noqa: E402
    Cluster,
    futures_workload,
    nested_workload,
    small_workload,
    wait_until_plugin_idle,
)

#: seconds after the results are in during which the CPU still counts, both sides:
#: plain ``distributed.span`` blocks are handed over once idle for ``idle-timeout``
#: (5 s) and a grace period, so the window covers their export
SETTLE_S = 7.5
#: gen-0 collection threshold: collections x this ~ container objects allocated (net)
GEN0_THRESHOLD = 700


def _threads(client: Any) -> dict[str, list[float]]:
    return client.run_on_scheduler(bench_clock.thread_cpu)


def _strace(pid: int) -> subprocess.Popen:
    return subprocess.Popen(["strace", "-c", "-f", "-p", str(pid)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _syscalls(proc: subprocess.Popen) -> dict[str, int]:
    proc.send_signal(2)
    _, err = proc.communicate(timeout=30)
    out = {}
    for line in err.splitlines():
        m = re.match(r"\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)$", line)
        if m:
            out[m.group(2)] = int(m.group(1))
    return out


def _py_spy(pid: int, path: str) -> subprocess.Popen:
    return subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "py-spy"), "record", "-p",
         str(pid), "-r", "1000", "--format", "raw", "-o", path, "--nonblocking",
         "--gil"],  # (the threads that hold the GIL: work, not waits)
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def one_run(with_plugin: bool, spans: int, per_span: int, strace: bool,
            profile: str | None = None, workload: str = "small") -> dict[str, float]:
    cluster = Cluster(with_plugin, workers=2, threads=2, export_process=True)
    try:
        client = cluster.client
        futures_workload(client, 4, 10)  # warm up
        time.sleep(SETTLE_S)
        if with_plugin:
            wait_until_plugin_idle(client)
            client.run_on_scheduler(bench_preload.reset)
        threads0, gc0 = _threads(client), client.run_on_scheduler(bench_clock.gc_figures)
        frames0 = client.run_on_scheduler(bench_clock.sender_frames)
        export0 = client.run_on_scheduler(bench_clock.export_figures)
        child0 = cluster.export_cpu()
        tracer = _strace(cluster.scheduler.pid) if strace else None
        spy = (_py_spy(cluster.scheduler.pid, f"{profile}-{int(with_plugin)}.txt")
               if profile else None)
        child_spy = None
        if profile and with_plugin:
            children = cluster.scheduler.children()
            if children:
                child_spy = _py_spy(children[0].pid, f"{profile}-child.txt")
        if tracer is not None or spy is not None:
            time.sleep(1.0)  # (attached)
        t0 = time.perf_counter()
        if workload == "nested":  # (spans one-task leaves, in 10 x 10 x ... levels)
            n = nested_workload(client, 10, 10, max(1, spans // 100))
        else:
            n = small_workload(client, spans, per_span)
        wall = time.perf_counter() - t0
        time.sleep(SETTLE_S)
        calls = _syscalls(tracer) if tracer is not None else {}
        for recorder in (spy, child_spy):
            if recorder is not None:
                recorder.send_signal(2)
                recorder.wait(30)
        threads1, gc1 = _threads(client), client.run_on_scheduler(bench_clock.gc_figures)
        frames = client.run_on_scheduler(bench_clock.sender_frames) - frames0
        export1 = client.run_on_scheduler(bench_clock.export_figures)
        child = cluster.export_cpu() - child0
        # (after the window, the same on both sides: the plugin's own figures, once
        # every span is exported; the window above normally covers that already)
        stats = wait_until_plugin_idle(client) if with_plugin else None
    finally:
        cluster.close()
    out: dict[str, float] = {"tasks/s": n / wall}
    per_span = 1e6 / spans  # seconds -> µs per span

    def diff(name: str) -> float:
        return (threads1.get(name, 0.0) - threads0.get(name, 0.0)) * per_span

    out["process"] = diff("process")
    out["process user (10 ms ticks)"] = diff("process user")
    out["process system (10 ms ticks)"] = diff("process system")
    live = 0.0
    for name in sorted(set(threads1) - {"process", "process user", "process system"}):
        cpu = diff(name)
        live += cpu
        label = f"thread {_thread_label(name)}"
        out[label] = out.get(label, 0.0) + cpu
    out["thread ended threads"] = out["process"] - live
    out["export process"] = child * per_span
    for gen in range(3):
        out[f"gc gen{gen} collections per span"] = (
            gc1["collections"][gen] - gc0["collections"][gen]) / spans
    out["gc cpu"] = (gc1["cpu_s"] - gc0["cpu_s"]) * per_span
    out["gc-tracked objects allocated per span (net, gen0 x 700)"] = (
        gc1["collections"][0] - gc0["collections"][0]) * GEN0_THRESHOLD / spans
    out["frames to export process per span"] = frames / spans
    if with_plugin:
        out["export process: GC CPU"] = (
            export1.get("gc_cpu_s", 0.0) - export0.get("gc_cpu_s", 0.0)) * per_span
        for gen in range(3):
            name = f"gc_collections_{gen}"
            out[f"export process: gen{gen} collections per span"] = (
                export1.get(name, 0) - export0.get(name, 0)) / spans
    if stats is not None:
        handed = max(stats["handed_over"], 1)
        out["export process: metric SDK calls per span"] = stats["metric_sdk_calls"] / handed
        out["export process: spans handed over per span"] = handed / spans
        for place, seconds in stats["cpu_by_place"].items():
            if place != "export process":
                out[f"plugin timed: {place}"] = seconds * per_span
    for call, count in calls.items():
        out[f"syscall {call} per span"] = count / spans
    return out


def _thread_label(name: str) -> str:
    """Thread names without their numbers (``ThreadPoolExecutor-0_1`` -> one line)."""
    return re.sub(r"[-_]?\d+(_\d+)?$", "", name) or name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--spans", type=int, default=300)
    parser.add_argument("--per-span", type=int, default=2)
    parser.add_argument("--workload", choices=("small", "nested"), default="small",
                        help="nested: one-task leaf spans three levels deep "
                             "(bench_scheduler's nested), --spans leaves")
    parser.add_argument("--strace", action="store_true")
    parser.add_argument("--profile", metavar="PATH", default=None,
                        help="py-spy raw profiles of the scheduler to PATH-0.txt "
                             "(baseline) and PATH-1.txt (plugin), and of the export "
                             "process to PATH-child.txt, last pair's")
    args = parser.parse_args(argv)
    print(f"machine: {os.cpu_count()} cores; small workload: {args.spans} spans x "
          f"{args.per_span} tasks; {args.pairs} pairs, alternating order; µs per span "
          "unless said")
    runs: dict[bool, list[dict[str, float]]] = defaultdict(list)
    for i in range(args.pairs):
        order = (False, True) if i % 2 == 0 else (True, False)
        for with_plugin in order:
            runs[with_plugin].append(one_run(with_plugin, args.spans, args.per_span,
                                             args.strace, args.profile, args.workload))
        base, plugin = runs[False][-1], runs[True][-1]
        print(f"  pair {i + 1}: tasks/s {plugin['tasks/s'] / base['tasks/s']:.3f}, "
              f"process CPU {plugin['process'] / base['process']:.3f}", flush=True)
    keys = sorted(set(runs[True][0]) | set(runs[False][0]))
    print(f"{'':<58} {'baseline':>10} {'plugin':>10} {'difference':>11}")
    for key in keys:
        b = statistics.median(r.get(key, 0.0) for r in runs[False])
        p = statistics.median(r.get(key, 0.0) for r in runs[True])
        print(f"  {key:<56} {b:10.2f} {p:10.2f} {p - b:+11.2f}")
    ratio = [p["tasks/s"] / b["tasks/s"] for b, p in zip(runs[False], runs[True])]
    cpu = [p["process"] / b["process"] for b, p in zip(runs[False], runs[True])]
    print(f"tasks/s plugin / baseline: median {statistics.median(ratio):.3f} "
          f"(pairs {min(ratio):.3f}-{max(ratio):.3f}); scheduler process CPU: median "
          f"{statistics.median(cpu):.3f} (pairs {min(cpu):.3f}-{max(cpu):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

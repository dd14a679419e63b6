"""The plugin's whole cost on one cluster: the plugin closed and removed, or registered
anew, on the same ``dask scheduler`` between workloads, in ABBA order.

    python benchmarks/bench_same_process.py                      # small, 16 pairs
    python benchmarks/bench_same_process.py --workload nested --pairs 8
    python benchmarks/bench_same_process.py --inert             # a plugin doing nothing
    python benchmarks/bench_same_process.py --stop-child        # no export work beside
    python benchmarks/bench_same_process.py --discard           # the loop's work alone
    python benchmarks/bench_same_process.py --without taps      # ... less a piece of it
    python benchmarks/bench_same_process.py --workload nested --set prefix_spans=False

``bench_scheduler.py`` starts a fresh cluster for every run: its pairs also differ by
where the processes landed and by the machine's drift over a run of ~15 s. Here both
sides run on the same scheduler, workers and client, a workload apart (~10 s): what is
left between the two sides of a pair is the plugin and the machine's moment-to-moment
noise. Per workload: tasks/s (the client's wall time), the scheduler process's CPU
over the workload and over the workload and ``--settle`` seconds after it (where the
export work of its spans runs: plain ``distributed.span`` blocks wait the idle-timeout
before they are emitted), the export process's CPU over the same window, and the
scheduler's user and system time, page faults and context switches over the workload
(``kernel_counts``: what a count of instructions under callgrind cannot see). The
plugin is the benchmark preload's (``bench_preload.dask_setup``: an export process
whose exporters discard); it is closed (its spans still open emitted, its heartbeat
wrappers undone) and its export process ended before a baseline workload starts, so
no work of one side runs in the other's window. (Up to a6e04b9 this script
unregistered the plugin without closing it: distributed's ``remove_plugin`` does not
close a plugin, so its baseline windows ran the earlier plugins' ticks and wrappers.)
"""
from __future__ import annotations

import argparse
import ast
import os
import signal
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_clock  # noqa: E402
from bench_scheduler import Cluster, nested_workload, small_workload  # noqa: E402

WORKLOADS = {
    "small": lambda client: small_workload(client, 300, 2),
    "nested": lambda client: nested_workload(client, 10, 10, 20),
}


async def _plug(dask_scheduler, on: bool, inert: bool = False,
                discard: bool = False, without: tuple[str, ...] = (),
                settings: dict | None = None) -> int:
    """Close and remove the benchmark's plugin; with ``on``, register a new one (an
    inert plugin with ``inert``; with ``discard``, one whose messages are dropped
    where the sender would queue them)."""
    import bench_inert
    import bench_preload

    from dask_otel_spans import OTelSpansPlugin

    for name, plugin in list(dask_scheduler.plugins.items()):
        if isinstance(plugin, (OTelSpansPlugin, bench_inert.InertPlugin)):
            del dask_scheduler.plugins[name]
            await plugin.close()
    if on and inert:
        await dask_scheduler.register_scheduler_plugin(bench_inert.InertPlugin(),
                                                       idempotent=False)
    elif on:
        plugin = OTelSpansPlugin(export_process=True,
                                 providers="bench_preload:child_providers",
                                 **(settings or {}))
        stats = bench_preload._loop_stats(plugin)
        stats.pause_clock = bench_preload.gc_cpu_of_this_thread
        await dask_scheduler.register_scheduler_plugin(plugin, idempotent=False)
        if discard:
            plugin.transport.sender.send = lambda messages: None
        _take_out(plugin, without)
    return sum(isinstance(p, (OTelSpansPlugin, bench_inert.InertPlugin))
               for p in dask_scheduler.plugins.values())


#: pieces of the plugin's event-loop work that ``--without`` takes out (reaching into
#: the plugin's privates: a diagnosis, not a configuration)
PIECES = ("taps", "tick", "transition", "update-graph")


def _take_out(plugin, without: tuple[str, ...]) -> None:
    if "taps" in without:  # the heartbeat taps (span deltas, worker-wide deltas)
        for undo in reversed(plugin._undo):
            undo()
        plugin._undo.clear()
    if "tick" in without:  # the forwarding (nothing reaches the export process)
        plugin._pc.stop()
    if "transition" in without:
        plugin.transition = lambda *args, **kwargs: None
    if "update-graph" in without:
        plugin.update_graph = lambda *args, **kwargs: None


def kernel_counts(pid: int) -> dict[str, float]:
    """The scheduler process's user and system CPU seconds (clock ticks), page faults
    and context switches (summed over its threads), from ``/proc``: what a count of
    the instructions executed cannot see."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    out = {"user s": int(fields[11]) / tick, "system s": int(fields[12]) / tick,
           "minor faults": float(fields[7]), "voluntary switches": 0.0,
           "involuntary switches": 0.0}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches"):
                        out["voluntary switches"] += int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches"):
                        out["involuntary switches"] += int(line.split()[1])
        except OSError:
            continue
    return out


def run(workload: str, pairs: int, settle: float, workers: int, threads: int,
        inert: bool = False, stop_child: bool = False, discard: bool = False,
        without: tuple[str, ...] = (), settings: dict | None = None) -> dict:
    cluster = Cluster(True, workers, threads, export_process=True)
    results: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    try:
        client = cluster.client
        for i in range(2 * pairs):
            on = (True, False, False, True)[i % 4]
            assert client.run_on_scheduler(_plug, on=on, inert=inert,
                                           discard=discard, without=without,
                                           settings=settings) == int(on)
            time.sleep(1.0)  # (the export process starts, or the old one's exit)
            stopped = ([c.pid for c in cluster.scheduler.children()] if stop_child
                       else [])
            cpu0, export0 = cluster.cpu(), cluster.export_cpu()
            gc0 = client.run_on_scheduler(bench_clock.gc_figures)
            kernel0 = kernel_counts(cluster.scheduler.pid)
            for pid in stopped:
                os.kill(pid, signal.SIGSTOP)
            started = time.monotonic()
            n = WORKLOADS[workload](client)
            wall = time.monotonic() - started
            cpu1 = cluster.cpu()
            kernel1 = kernel_counts(cluster.scheduler.pid)
            gc1 = client.run_on_scheduler(bench_clock.gc_figures)
            for pid in stopped:
                os.kill(pid, signal.SIGCONT)
            time.sleep(settle)
            one = {"tasks/s": n / wall, "scheduler CPU, workload": cpu1 - cpu0,
                   "scheduler CPU, with settle": cluster.cpu() - cpu0,
                   "export CPU": cluster.export_cpu() - export0 if on else 0.0,
                   **{k: kernel1[k] - kernel0[k] for k in kernel0},
                   "GC s": gc1["cpu_s"] - gc0["cpu_s"],
                   **{f"gen-{g} GCs": float(gc1["collections"][g]
                                            - gc0["collections"][g]) for g in range(3)}}
            results[on].append(one)
            print(f"  {i + 1:2d} {'plugin' if on else 'none  '} "
                  + ", ".join(f"{k} {v:.3f}" for k, v in one.items()), flush=True)
    finally:
        cluster.close()
    return results


#: the per-workload figures of ``kernel_counts`` and the garbage collections (over the
#: workload; ``bench_clock``, preloaded on the scheduler, counts them)
KERNEL = ("user s", "system s", "minor faults", "voluntary switches",
          "involuntary switches", "GC s", "gen-0 GCs", "gen-1 GCs", "gen-2 GCs")


def report(results: dict) -> None:
    pairs = list(zip(results[True], results[False]))
    print(f"plugin / none, {len(pairs)} pairs (ABBA on one cluster):")
    # (the kernel's counters and the collections: per side only, as counts that may
    # be 0, or steps of 10 ms, make no ratio)
    for key in ("tasks/s", "scheduler CPU, workload", "scheduler CPU, with settle"):
        ratios = sorted(a[key] / b[key] for a, b in pairs)
        half = ratios[len(ratios) // 4:len(ratios) - len(ratios) // 4]
        print(f"  {key:28s} median {statistics.median(ratios):.3f}  min {ratios[0]:.3f}"
              f"  max {ratios[-1]:.3f}  middle half {half[0]:.3f}-{half[-1]:.3f}")
    print("  per workload, median plugin / none: " + ", ".join(
        f"{k} {statistics.median(a[k] for a, _ in pairs):.3f} / "
        f"{statistics.median(b[k] for _, b in pairs):.3f}" for k in KERNEL))
    export = statistics.median(a["export CPU"] / b["scheduler CPU, with settle"]
                               for a, b in pairs)
    print(f"  export process CPU, of the baseline scheduler's (workload + settle): "
          f"median {export:.3f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="small")
    parser.add_argument("--pairs", type=int, default=16)
    parser.add_argument("--settle", type=float, default=7.5,
                        help="seconds after a workload whose CPU counts for it")
    parser.add_argument("--inert", action="store_true",
                        help="the plugin side is a plugin whose hooks do nothing "
                             "(bench_inert): what a plugin's presence costs")
    parser.add_argument("--stop-child", action="store_true",
                        help="the export process suspended while the workload runs "
                             "(its pipe fills, the sender thread waits), let go after")
    parser.add_argument("--discard", action="store_true",
                        help="the plugin's messages dropped where the sender would "
                             "queue them: its event-loop work without the sender "
                             "thread's or the export process's")
    parser.add_argument("--without", default="",
                        help="comma-separated pieces of the plugin's event-loop work "
                             f"to take out of the plugin side: {', '.join(PIECES)}")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="a setting of the plugin side, by field of PluginConfig "
                             "(e.g. prefix_spans=False, span_name_depth=1); repeatable")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    print(f"{args.workload}: {args.pairs} pairs, settle {args.settle} s, "
          f"{args.workers} workers x {args.threads} threads"
          + (f", the plugin side with {', '.join(args.set)}" if args.set else ""))
    report(run(args.workload, args.pairs, args.settle, args.workers, args.threads,
               args.inert, args.stop_child, args.discard,
               tuple(p for p in args.without.split(",") if p),
               {k: ast.literal_eval(v) for k, v in
                (item.split("=", 1) for item in args.set)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

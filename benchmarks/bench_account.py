"""Where the scheduler's CPU goes with and without the plugin, on the ``small``
workload (300 plain ``distributed.span`` blocks of 2 tasks, one graph each): the
accounting asked for by the cost-of-a-span work.

    python benchmarks/bench_account.py                  # 8 pairs
    python benchmarks/bench_account.py --pairs 2 --spans 60   # quick look
    python benchmarks/bench_account.py --strace          # + system calls (slows both)
    python benchmarks/bench_account.py --instructions --pairs 4 --spans 150
        # the scheduler under valgrind: instructions executed (slows both ~40x)
    python benchmarks/bench_account.py --instructions --cache-sim --pairs 2 --spans 150
        # ... and valgrind's cache model: the scheduler's cache misses
    python benchmarks/bench_account.py --pin --stop-child --pairs 8
        # the scheduler alone on CPU 0, the export process suspended during the workload

Each pair runs a fresh ``dask scheduler`` (``--preload bench_clock`` on both sides;
``--preload bench_preload`` adds the plugin with its export process, as shipped) and
two ``dask worker`` processes, baseline and plugin in alternating order. Per run: tasks/s;
the scheduler process's user and system CPU, per thread by name (``MainThread`` runs
the event loop; threads that ended count in ``ended threads``); its export process;
the garbage collections (per generation) and their CPU; the frames written to the
export process; with ``--strace``, the system calls by name. The plugin side also
reads the plugin's own timed CPU (event loop, sender thread). Reported per span
(µs), as medians over the pairs, both sides and their difference.

``--instructions`` runs the scheduler under valgrind's callgrind, instrumentation off
until the workload starts and dumped when the window ends (``callgrind_control``):
the instructions the scheduler process executed in the window, every thread and the
garbage collections included, and its system calls (``sysCount``). A count of work
done, not a time: on a shared machine it moves far less between runs than CPU time.
The scheduler runs ~40 times slower under valgrind, so every wall-clock-driven piece
of work would run ~40 times more often per span than natively: ``--time-scale``
(default 40 with ``--instructions``) makes the plugin's ticks that many times rarer and
their slices that many times longer, so that a tick finds the native amount of work.
The workers' heartbeats and distributed's own periodic callbacks are not scaled (they
are the same on both sides; the plugin's share of heartbeat work stays overstated).
"""
from __future__ import annotations

import argparse
import fcntl
import os
import re
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from typing import Any

import psutil

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
    wide_workload,
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


def callgrind_wrapper(path: str, cache_sim: bool = False,
                       branch_sim: bool = False) -> list[str]:
    return ["valgrind", "--tool=callgrind", "--instr-atstart=no",
            "--collect-systime=yes", f"--callgrind-out-file={path}.%p",
            *(["--cache-sim=yes"] if cache_sim else []),
            *(["--branch-sim=yes"] if branch_sim else [])]


def callgrind(pid: int, *options: str) -> None:
    subprocess.run(["callgrind_control", *options, str(pid)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)


def callgrind_totals(path: str, pid: int, timeout: float = 120.0) -> dict[str, int]:
    """Event totals of the dumps of ``pid`` (``Ir``, ``sysCount``, ``sysTime``),
    waiting up to ``timeout`` seconds for a dump to be written whole
    (``callgrind_control --dump`` may return before its file is)."""
    deadline = time.monotonic() + timeout
    while True:
        out = _dumped_totals(path, pid)
        if out.get("Ir") or time.monotonic() > deadline:
            return out
        time.sleep(0.5)


def _dumped_totals(path: str, pid: int) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    folder, stem = os.path.split(f"{path}.{pid}")
    for name in os.listdir(folder or "."):
        if not name.startswith(stem + "."):
            continue  # (the dumps: stem.1, stem.2, ...; stem itself is the end's)
        events: list[str] = []
        with open(os.path.join(folder, name)) as f:
            for line in f:
                if line.startswith("events:"):
                    events = line.split()[1:]
                elif line.startswith(("totals:", "summary:")):
                    for event, count in zip(events, line.split()[1:]):
                        out[event] += int(count)
                    break
    return dict(out)


def _py_spy(pid: int, path: str) -> subprocess.Popen:
    return subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "py-spy"), "record", "-p",
         str(pid), "-r", "1000", "--format", "raw", "-o", path, "--nonblocking",
         "--gil"],  # (the threads that hold the GIL: work, not waits)
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


#: ``otel-spans.profile.enabled`` as the scheduler's environment says it (``--profiles``)
PROFILES_VARIABLE = "DASK_OTEL_SPANS__PROFILE__ENABLED"


def one_run(with_plugin: bool, spans: int, per_span: int, strace: bool,
            profile: str | None = None, workload: str = "small",
            instructions: str | None = None, inert: bool = False,
            time_scale: float = 1.0, pin: bool = False,
            stop_child: bool = False, pipe_size: int = 0,
            cache_sim: bool = False, branch_sim: bool = False,
            profiles: bool = False) -> dict[str, float]:
    side = int(with_plugin)  # (the name of its py-spy file)
    if profiles:  # (the plugin on both sides, profiles on for the "plugin" side)
        os.environ[PROFILES_VARIABLE] = "true" if with_plugin else "false"
        with_plugin = True
    wrapper = (callgrind_wrapper(instructions, cache_sim, branch_sim) if instructions
               else None)
    if pin:  # the scheduler alone on CPU 0; everything else on the other CPUs
        wrapper = ["taskset", "-c", "0", *(wrapper or ())]
    os.environ[bench_preload.TIME_SCALE_VARIABLE] = str(time_scale)
    if inert and with_plugin:  # (the other side: a plugin whose hooks do nothing)
        with_plugin = False
        cluster = Cluster(False, workers=2, threads=2, inert=True,
                          scheduler_wrapper=wrapper)
    else:
        cluster = Cluster(with_plugin, workers=2, threads=2, export_process=True,
                          scheduler_wrapper=wrapper)
    try:
        client = cluster.client
        if pin:
            others = set(range(1, os.cpu_count() or 2))
            for proc in [*cluster.procs[1:], *cluster.scheduler.children(recursive=True)]:
                psutil.Process(proc.pid).cpu_affinity(sorted(others))
            os.sched_setaffinity(0, others)
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
        spy = (_py_spy(cluster.scheduler.pid, f"{profile}-{side}.txt")
               if profile else None)
        child_spy = None
        if profile and with_plugin:
            children = cluster.scheduler.children()
            if children:
                child_spy = _py_spy(children[0].pid, f"{profile}-child"
                                    f"{'-' + str(side) if profiles else ''}.txt")
        if tracer is not None or spy is not None:
            time.sleep(1.0)  # (attached)
        if instructions:
            callgrind(cluster.scheduler.pid, "--instr=on")
        stopped = (cluster.scheduler.children(recursive=True)
                   if stop_child and with_plugin else [])
        for child in stopped if pipe_size else ():
            # (the pipe to the export process made large enough for the whole
            # workload: the sender thread keeps sending while the child is stopped)
            with open(f"/proc/{child.pid}/fd/0", "wb") as pipe:
                fcntl.fcntl(pipe, 1031, pipe_size)  # F_SETPIPE_SZ
        for child in stopped:  # (its pipe fills; the sender thread waits on it)
            child.suspend()
        t0 = time.perf_counter()
        if workload == "nested":  # (spans one-task leaves, in 10 x 10 x ... levels)
            n = nested_workload(client, 10, 10, max(1, spans // 100))
        elif workload == "wide":  # (one span of ``spans`` one-task child spans)
            n = wide_workload(client, spans)
        else:
            n = small_workload(client, spans, per_span)
        wall = time.perf_counter() - t0
        for child in stopped:
            child.resume()
        time.sleep(SETTLE_S)
        if instructions:
            callgrind(cluster.scheduler.pid, "--dump")
            callgrind(cluster.scheduler.pid, "--instr=off")
            counted = callgrind_totals(instructions, cluster.scheduler.pid)
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
    if instructions:
        out["instructions (millions) per span"] = counted.get("Ir", 0) / 1e6 / spans
        out["system calls per span"] = counted.get("sysCount", 0) / spans
        if cache_sim:  # (valgrind's model of this machine's caches, this process alone)
            for key, events in ((_D1, ("I1mr", "D1mr", "D1mw")),
                                (_LL, ("ILmr", "DLmr", "DLmw"))):
                out[key] = sum(counted.get(e, 0) for e in events) / 1e3 / spans
        if branch_sim:  # (valgrind's model of a branch predictor)
            out[_BRANCHES] = (counted.get("Bcm", 0) + counted.get("Bim", 0)) / 1e3 / spans

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


_IR = "instructions (millions) per span"
_SYSCALLS = "system calls per span"
_D1 = "first-level cache misses (thousands) per span"
_LL = "last-level cache misses (thousands) per span"
_BRANCHES = "mispredicted branches (thousands) per span"


def _thread_label(name: str) -> str:
    """Thread names without their numbers (``ThreadPoolExecutor-0_1`` -> one line)."""
    return re.sub(r"[-_]?\d+(_\d+)?$", "", name) or name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--spans", type=int, default=300)
    parser.add_argument("--per-span", type=int, default=2)
    parser.add_argument("--workload", choices=("small", "nested", "wide"),
                        default="small",
                        help="nested: one-task leaf spans three levels deep "
                             "(bench_scheduler's nested), --spans leaves; wide: one "
                             "span of --spans one-task child spans (one graph)")
    parser.add_argument("--profiles", action="store_true",
                        help="the plugin on both sides: the baseline with "
                             "otel-spans.profile.enabled false, the other true")
    parser.add_argument("--strace", action="store_true")
    parser.add_argument("--instructions", metavar="PATH", nargs="?", const="callgrind",
                        default=None,
                        help="run the scheduler under callgrind (dumps to PATH.<pid>.N, "
                             "default ./callgrind): instructions and system calls "
                             "in the window")
    parser.add_argument("--time-scale", type=float, default=None,
                        help="the plugin's ticks this many times rarer, their slices "
                             "this many times longer (default: 40 with "
                             "--instructions, else 1)")
    parser.add_argument("--pin", action="store_true",
                        help="the scheduler alone on CPU 0, the workers, the export "
                             "process and this client on the others")
    parser.add_argument("--stop-child", action="store_true",
                        help="suspend the export process while the workload runs "
                             "(SIGSTOP; it catches up in the settle): what its "
                             "running beside the scheduler costs the scheduler")
    parser.add_argument("--pipe-size", type=int, default=0,
                        help="with --stop-child: make the pipe to the export process "
                             "this many bytes (F_SETPIPE_SZ), so that the sender "
                             "thread does not wait on it")
    parser.add_argument("--inert", action="store_true",
                        help="set against the baseline a plugin with the same hooks "
                             "doing nothing (bench_inert): what a plugin's presence "
                             "costs")
    parser.add_argument("--cache-sim", action="store_true",
                        help="with --instructions: valgrind's cache model too (first- "
                             "and last-level misses of the scheduler process; ~2x "
                             "slower)")
    parser.add_argument("--branch-sim", action="store_true",
                        help="with --instructions: valgrind's branch predictor model "
                             "too (mispredicted branches of the scheduler process)")
    parser.add_argument("--profile", metavar="PATH", default=None,
                        help="py-spy raw profiles of the scheduler to PATH-0.txt "
                             "(baseline) and PATH-1.txt (plugin), and of the export "
                             "process to PATH-child.txt, last pair's")
    args = parser.parse_args(argv)
    time_scale = (args.time_scale if args.time_scale is not None
                  else 40.0 if args.instructions else 1.0)
    shape = (f"{args.spans} one-task leaf spans" if args.workload == "nested"
             else f"{args.spans} spans x {args.per_span} tasks")
    print(f"machine: {os.cpu_count()} cores; {args.workload} workload: {shape}; "
          f"{args.pairs} pairs, alternating order; µs per span unless said"
          + ("; the scheduler under callgrind" if args.instructions else "")
          + (f"; the plugin's ticks {time_scale:g} times rarer" if time_scale != 1
             else "")
          + ("; the plugin side is an inert plugin" if args.inert else "")
          + ("; the plugin on both sides, profiles off (baseline) / on (plugin)"
             if args.profiles else "")
          + ("; the scheduler pinned alone to CPU 0" if args.pin else "")
          + ("; the export process suspended during the workload" if args.stop_child
             else "")
          + (f"; its pipe {args.pipe_size} bytes" if args.pipe_size else ""))
    runs: dict[bool, list[dict[str, float]]] = defaultdict(list)
    for i in range(args.pairs):
        order = (False, True) if i % 2 == 0 else (True, False)
        for with_plugin in order:
            runs[with_plugin].append(one_run(with_plugin, args.spans, args.per_span,
                                             args.strace, args.profile, args.workload,
                                             args.instructions, args.inert,
                                             time_scale, args.pin, args.stop_child,
                                             args.pipe_size, args.cache_sim,
                                             args.branch_sim, args.profiles))
        base, plugin = runs[False][-1], runs[True][-1]
        line = (f"  pair {i + 1}: tasks/s {plugin['tasks/s'] / base['tasks/s']:.3f}, "
                f"process CPU {plugin['process'] / base['process']:.3f}")
        if args.instructions:
            line += f", instructions {plugin[_IR] / base[_IR]:.4f}"
        print(line, flush=True)
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
    if args.instructions:
        for label, key in (("instructions", _IR), ("system calls", _SYSCALLS),
                           ("first-level cache misses", _D1),
                           ("last-level cache misses", _LL),
                           ("mispredicted branches", _BRANCHES)):
            if key not in runs[True][0]:
                continue
            both = [(b[key], p[key]) for b, p in zip(runs[False], runs[True])]
            r = [p / b for b, p in both if b]
            spread = [statistics.pstdev(side) / statistics.mean(side)
                      for side in zip(*both)] if len(both) > 1 else [0.0, 0.0]
            if r:
                print(f"scheduler process {label} plugin / baseline: median "
                      f"{statistics.median(r):.4f} (pairs {min(r):.4f}-{max(r):.4f}); "
                      f"spread between runs of one side (sd / mean): baseline "
                      f"{spread[0]:.2%}, plugin {spread[1]:.2%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

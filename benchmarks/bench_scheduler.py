"""Scheduler overhead of dask_otel_spans: the same workloads with and without the
plugin, in rotating order, on the same cluster configuration, reported as ratios.

    python benchmarks/bench_scheduler.py            # full (figures in the README)
    python benchmarks/bench_scheduler.py --quick    # smoke test (CI)
    python benchmarks/bench_scheduler.py --parts memory,export   # a subset
    python benchmarks/bench_scheduler.py --export-process  # the plugin with its
                                                           # export process (the
                                                           # default with providers
                                                           # from configuration)
    python benchmarks/bench_scheduler.py --both-modes      # both ways, against the
                                                           # same baselines
    python benchmarks/bench_scheduler.py --against TREE    # also the plugin of another
                                                           # source tree (e.g. a git
                                                           # worktree of an older
                                                           # commit), same rounds
    python benchmarks/bench_scheduler.py --inert           # also an inert plugin (its
                                                           # hooks, no work), same rounds
    python benchmarks/bench_scheduler.py --time-limit 540  # part 1 stops starting
                                                           # rounds that would end
                                                           # later (a leased machine)

Parts:
1. throughput: 20,000 small tasks over 200 spans (futures, then one delayed graph), and
   a graph of 2,000 spans nested three levels (each graph computed as one collection:
   see ``compute_as_one``; ``--workloads delayed-list,nested-list`` computes them as
   lists of collections, as the runs before 2026-11-24 evening did); tasks/s (until the
   results are in) and scheduler-process CPU s/task (until 3 s later, so that emitting
   the workload's spans counts for it; the next workload starts once the plugin is
   idle), and the plugin's own CPU in the scheduler process as a fraction of the rest
   of the run's and per span (µs); the workers' CPU s/task (the same code on both
   sides) as a control for the machine's speed, and the CPU ratio with it divided out
2. event-loop cost: longest single plugin hook/callback call, total, 10,000-task graph
   (``--workloads wide``, not in the default set: one span with 3,000 child spans of one
   task each, a parent whose check and copy cover thousands of open children);
   ``--workloads small``: 300 plain ``distributed.span`` blocks of 2 tasks, one graph
   each (``bench_account.py`` breaks its cost down)
3. memory: the plugin's retained memory after 1k, 10k, 100k emitted spans
4. latency: dask span done -> OTel span at the exporter, against the grace period
5. export cost: a span with 50 task prefixes and full metrics: the copy taken on the
   event loop, and the translation + SDK calls on the ender thread
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import statistics
import subprocess
import sys
import time
import tracemalloc
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import dask
import psutil
from distributed import Client
from distributed import span as dask_span

HERE = os.path.dirname(os.path.abspath(__file__))
#: the source tree this benchmark belongs to
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import bench_clock  # noqa: E402
import bench_preload  # noqa: E402
from bench_tasks import inc  # noqa: E402

from dask_otel_spans import span  # noqa: E402


class _MemTask:
    """A task of a group made by the memory benchmark (what ``task_moved`` reads)."""

    run_spec = None

    def __init__(self, group: Any) -> None:
        self.group = group


# -- a cluster of real processes ---------------------------------------------------------


def process_cpu_seconds(process: psutil.Process) -> float:
    """CPU seconds of another process, to the nanosecond where the system allows.

    ``psutil``'s figures come from ``/proc/PID/stat`` in clock ticks (10 ms): the
    export process of a quick run spends less than a tick on a small workload. On
    Linux the process's CPU-time clock (``clock_getcpuclockid``'s id, built as the
    kernel does: ``~pid << 3 | CPUCLOCK_SCHED``) has no such steps and counts its
    threads that have ended."""
    if sys.platform.startswith("linux"):
        try:
            return time.clock_gettime((~process.pid << 3) | 2)
        except OSError:
            pass
    t = process.cpu_times()
    return t.user + t.system


class Cluster:
    """``dask scheduler`` (optionally with the plugin preloaded) + ``dask worker``s."""

    def __init__(self, with_plugin: bool, workers: int, threads: int,
                 export_process: bool = False, plugin_tree: str | None = None,
                 inert: bool = False, preload: str | None = None,
                 scheduler_wrapper: list[str] | None = None,
                 environ: dict[str, str] | None = None, clock: bool = True):
        self.with_plugin = with_plugin
        self.inert = inert
        #: a module to preload instead of a plugin
        self.preload = "bench_inert" if inert else preload
        # the plugin of this source tree, or of another one (plugin_tree); the
        # processes run in HERE, so that no package in the working directory
        # (``python -m`` puts it first on sys.path) shadows it
        tree = plugin_tree or ROOT
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([tree, HERE, *sys.path])}
        env = {k: v for k, v in env.items() if not k.startswith("OTEL_")}
        env.update(environ or {})  # (the OTEL_* of a preload that reads them)
        env.pop(bench_preload.RECORDS_VARIABLE, None)
        self.records = None
        if with_plugin and export_process:
            self.records = self._file().replace(".json", "-records.tsv")
            env[bench_preload.RECORDS_VARIABLE] = self.records
        # (scheduler_wrapper: a command that runs the scheduler's, e.g. valgrind's)
        cmd = [*(scheduler_wrapper or ()), sys.executable, "-m", "dask", "scheduler",
               "--host", "127.0.0.1",
               "--port", "0", "--no-dashboard", "--scheduler-file", self._file()]
        if clock:  # both sides: the latencies' reference (``clock=False``: neither)
            cmd += ["--preload", "bench_clock"]
        if with_plugin:
            cmd += ["--preload", "bench_preload"]
        elif self.preload:
            cmd += ["--preload", self.preload]
        self.procs = [subprocess.Popen(cmd, env=env, cwd=HERE, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL)]
        for _ in range(workers):
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "dask", "worker", "--scheduler-file",
                 self._file(), "--nthreads", str(threads), "--no-dashboard",
                 "--no-nanny"],
                env=env, cwd=HERE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        self.client = Client(scheduler_file=self._file(), timeout=60)
        self.client.wait_for_workers(workers, timeout=60)
        self.scheduler = psutil.Process(self.procs[0].pid)

    def _file(self) -> str:
        side = self.preload or int(self.with_plugin)
        return os.path.join(HERE, f".scheduler-{os.getpid()}-{side}.json")

    def cpu(self) -> float:
        return process_cpu_seconds(self.scheduler)

    def workers_cpu(self) -> float:
        """CPU seconds of the worker processes: the same code on both sides (the plugin
        runs in the scheduler), so the control for the machine's speed at the time."""
        return sum(process_cpu_seconds(psutil.Process(p.pid)) for p in self.procs[1:])

    def export_cpu(self) -> float:
        """CPU seconds of the scheduler's child processes (the export process)."""
        total = 0.0
        for child in self.scheduler.children(recursive=True):
            try:
                total += process_cpu_seconds(child)
            except (OSError, psutil.Error):
                continue
        return total

    def loop_cpu(self) -> float:
        """CPU seconds of the scheduler's main thread, which runs its event loop (the
        scheduler's bottleneck); the plugin's ender and metrics threads, the SDK's
        export threads and distributed's offload thread are the other threads."""
        for thread in self.scheduler.threads():
            if thread.id == self.scheduler.pid:
                return thread.user_time + thread.system_time
        return 0.0

    def close(self) -> None:
        self.client.close()
        # workers first: in a diagnostic run, processes outlived terminate() by the
        # 30 s wait in two closes of six (a worker stopping after its scheduler has
        # gone may wait for it)
        workers, scheduler = self.procs[1:], self.procs[0]
        for group in (workers, [scheduler]):
            for p in group:
                p.terminate()
            for p in group:
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        for path in (self._file(), self.records):
            try:
                if path:
                    os.remove(path)
            except OSError:
                pass


# -- workloads -----------------------------------------------------------------------


def futures_workload(client: Client, n_spans: int, per_span: int) -> int:
    """``n_spans`` spans of ``per_span`` futures each, submitted one span after the
    other and gathered at the end. Tuple keys with a name per span: one TaskGroup
    per span, as dask collections get (``client.map(inc, ...)``'s keys would all fall
    in TaskGroup ``inc``, which distributed attaches to the first span only)."""
    futures = []
    for i in range(n_spans):
        with span("futures", f"span-{i}"):
            name = f"f{i}-{uuid.uuid4().hex}"
            futures += client.map(inc, range(per_span),
                                  key=[(name, j) for j in range(per_span)])
    client.gather(futures)
    return n_spans * per_span


def interactive_workload(client: Client, n_spans: int, per_span: int) -> int:
    """One graph per span, waited for before the next: a loop of ``span()`` blocks
    that each compute and wait, as interactive users work."""
    for i in range(n_spans):
        with span("interactive", f"step-{i}"):
            name = f"i{i}-{uuid.uuid4().hex}"
            outs = [dask.delayed(inc)(j, dask_key_name=(name, j))
                    for j in range(per_span)]
            client.gather(client.compute(outs))
    return n_spans * per_span


def compute_as_one(client: Client, outs: list[Any], *tags: str) -> None:
    """Compute ``outs`` as one collection (a list made by one more task, in span
    ``tags``) and wait for the results.

    ``client.compute(outs)`` would make each of ``outs`` a collection of its own, and
    distributed deep-copies the list of a graph's collections into every span that
    graph touches (``Span.add_metadata``): O(collections x spans), which took 2.97 of
    the 3.83 s of scheduler CPU of nested's baseline run as a list of 2,000 (and 5.4
    of 26 s of delayed's), a cost that would hide the plugin's behind distributed's.
    """
    with span(*tags):
        together = dask.delayed(outs)
    client.gather(client.compute(together))


def delayed_workload(client: Client, n_spans: int, per_span: int,
                     one_collection: bool = True) -> int:
    outs = []
    for i in range(n_spans):
        with span("delayed", f"span-{i}"):
            # tuple keys with a name of their own: one TaskGroup per span, as a dask
            # collection gets (string keys "d-<i>-<j>" would all fall in TaskGroup "d",
            # which distributed attaches to the first span only)
            name = f"d{i}-{uuid.uuid4().hex}"
            outs += [dask.delayed(inc)(j, dask_key_name=(name, j)) for j in range(per_span)]
    if one_collection:
        compute_as_one(client, outs, "delayed", "gather")
    else:
        client.gather(client.compute(outs))
    return n_spans * per_span


def nested_workload(client: Client, a: int, b: int, c: int,
                    one_collection: bool = True, per_leaf: int = 1) -> int:
    """``a`` x ``b`` x ``c`` leaf spans, three levels deep, of ``per_leaf`` tasks each
    (one TaskGroup per leaf span)."""
    outs = []
    for i in range(a):
        with span(f"l1-{i}"):
            for j in range(b):
                with span(f"l2-{j}"):
                    for k in range(c):
                        with span(f"l3-{k}"):
                            name = f"n-{uuid.uuid4().hex}"
                            outs += [dask.delayed(inc)(k, dask_key_name=(name, t))
                                     for t in range(per_leaf)]
    if one_collection:
        compute_as_one(client, outs, "l1-gather")
    else:
        client.gather(client.compute(outs))
    return a * b * c * per_leaf


def nested_x10_workload(client: Client, a: int, b: int, c: int) -> int:
    """``nested`` with 10 tasks per leaf span: how the cost per span weighs with more
    tasks to share it."""
    return nested_workload(client, a, b, c, per_leaf=10)


def delayed_list_workload(client: Client, n_spans: int, per_span: int) -> int:
    """``delayed`` computed as a list of 20,000 collections (runs A-AU)."""
    return delayed_workload(client, n_spans, per_span, one_collection=False)


def nested_list_workload(client: Client, a: int, b: int, c: int) -> int:
    """``nested`` computed as a list of 2,000 collections (runs A-AU)."""
    return nested_workload(client, a, b, c, one_collection=False)


def big_graph_workload(client: Client, n: int) -> int:
    with span("big graph"):
        outs = [dask.delayed(inc)(j, dask_key_name=f"b-{j}-{uuid.uuid4().hex}") for j in range(n)]
        client.gather(client.compute(outs))
    return n


def wide_workload(client: Client, n: int) -> int:
    """One span with ``n`` child spans of one task each, in one graph: a parent whose
    check walks many open children, and whose copy lists them all."""
    outs = []
    with span("wide"):
        for i in range(n):
            with span(f"child-{i}"):
                outs.append(dask.delayed(inc)(i, dask_key_name=(f"w-{uuid.uuid4().hex}", i)))
    client.gather(client.compute(outs))
    return n


def small_workload(client: Client, n_spans: int, per_span: int) -> int:
    """``n_spans`` plain ``distributed.span`` blocks (dask's own, no client helper) of
    ``per_span`` tasks each, one graph per block and a TaskGroup of its own, submitted
    back to back and gathered at the end: many small spans, as a pipeline of small
    steps makes them."""
    futures = []
    for i in range(n_spans):
        with dask_span("small", f"step-{i}"):
            name = f"s{i}-{uuid.uuid4().hex}"
            futures += client.compute([dask.delayed(inc)(j, dask_key_name=(name, j))
                                       for j in range(per_span)])
    client.gather(futures)
    return n_spans * per_span


WORKLOADS = {
    "futures": futures_workload,
    "interactive": interactive_workload,
    "delayed": delayed_workload,
    "nested": nested_workload,
    "big-graph": big_graph_workload,
}
#: workloads run only when named in --workloads
EXTRA_WORKLOADS = {
    "small": small_workload,
    "wide": wide_workload,
    "delayed-list": delayed_list_workload,
    "nested-list": nested_list_workload,
    "nested-x10": nested_x10_workload,
}
ALL_WORKLOADS = {**WORKLOADS, **EXTRA_WORKLOADS}


#: Seconds after a workload's results are in during which the scheduler's CPU still
#: counts for it (both sides): the plugin emits a span a grace period (1 s) after it is
#: done, so the CPU of emitting the workload's last spans belongs to it
SETTLE_S = 3.0


def wait_until_plugin_idle(client: Client, timeout: float = 60) -> dict:
    """The plugin's figures once every span is emitted and exported."""
    deadline = time.monotonic() + timeout
    while True:
        stats = client.run_on_scheduler(bench_preload.stats)
        done = stats["open"] == 0 and len(stats["latencies"]) >= stats["handed_over"]
        if done or time.monotonic() > deadline:
            return stats
        time.sleep(0.2)


def plugin_cpu_in_scheduler(stats: dict | None) -> float:
    """CPU seconds the plugin itself spent in the scheduler process so far: its hooks
    and callbacks on the event loop and its own threads (not the export process)."""
    if not stats:
        return 0.0
    return sum(seconds for place, seconds in stats["cpu_by_place"].items()
               if place != "export process")


def run_once(with_plugin: bool, scale: dict[str, Any], workers: int, threads: int,
             export_process: bool = False, plugin_tree: str | None = None,
             inert: bool = False, settle_s: float = SETTLE_S):
    cluster = Cluster(with_plugin, workers, threads, export_process, plugin_tree, inert)
    out: dict[str, tuple[float, ...]] = {}
    stats = None
    try:
        client = cluster.client
        futures_workload(client, 4, 10)  # warm up imports and connections
        # both sides start the first workload on a scheduler quiet for as long (the
        # plugin's side also waits for the warm-up's spans to be exported): a
        # baseline starting right after the warm-up ran its futures ~10 % faster
        time.sleep(settle_s)
        if with_plugin:
            wait_until_plugin_idle(client)
            client.run_on_scheduler(bench_preload.reset)
            stats = client.run_on_scheduler(bench_preload.stats)
        for name, fn in ALL_WORKLOADS.items():
            if name not in scale:
                continue
            args = scale[name]
            gc0 = client.run_on_scheduler(bench_clock.gc_figures)
            own0 = plugin_cpu_in_scheduler(stats)
            spans0 = stats["handed_over"] if with_plugin else 0
            cpu0, loop0, t0 = cluster.cpu(), cluster.loop_cpu(), time.perf_counter()
            child0, workers0 = cluster.export_cpu(), cluster.workers_cpu()
            n = fn(client, *args)
            wall = time.perf_counter() - t0
            time.sleep(settle_s)
            cpu = cluster.cpu() - cpu0
            loop = cluster.loop_cpu() - loop0
            workers = cluster.workers_cpu() - workers0
            gc1 = client.run_on_scheduler(bench_clock.gc_figures)
            gc_cpu = gc1["cpu_s"] - gc0["cpu_s"]
            full = gc1["collections"][2] - gc0["collections"][2]
            if with_plugin:
                # the next workload starts on a quiet scheduler, as in the baseline
                stats = wait_until_plugin_idle(client)
            # (read once the workload's spans are exported: on a busy machine the
            # export process may still be at them when the window above ends)
            child = cluster.export_cpu() - child0
            own = plugin_cpu_in_scheduler(stats) - own0
            spans = stats["handed_over"] - spans0 if with_plugin else 0
            out[name] = (n / wall, cpu / n, loop / n, child / n, gc_cpu / n, full,
                         own / n, workers / n, spans)
    finally:
        cluster.close()
    return out, stats


def scale_tasks(scale: dict[str, Any]) -> dict[str, int]:
    """Tasks per workload at this scale."""
    count = {
        "futures": lambda spans, per_span: spans * per_span,
        "interactive": lambda spans, per_span: spans * per_span,
        "delayed": lambda spans, per_span: spans * per_span,
        "nested": lambda a, b, c: a * b * c,
        "big-graph": lambda tasks: tasks,
        "wide": lambda children: children,
        "small": lambda spans, per_span: spans * per_span,
    }
    count["delayed-list"], count["nested-list"] = count["delayed"], count["nested"]
    count["nested-x10"] = lambda a, b, c: a * b * c * 10
    return {name: count[name](*args) for name, args in scale.items()}


def largest_graph(scale: dict[str, Any]) -> int:
    """Tasks in the largest single submission: futures go 100 per ``client.map``;
    the other workloads are one graph each."""
    return max(shape[-1] if name in ("futures", "interactive")
               else scale_tasks({name: shape})[name]
               for name, shape in scale.items())


def fmt_ratio(values: list[float]) -> str:
    """Median, min and max; with four pairs or more, also the middle half (quartiles)."""
    text = (f"median {statistics.median(values):.3f}  min {min(values):.3f}  "
            f"max {max(values):.3f}")
    if len(values) >= 4:
        low, _, high = statistics.quantiles(values, n=4, method="inclusive")
        text += f"  middle half {low:.3f}-{high:.3f}"
    return text


MODE_NAMES = {False: "plugin exporting in the scheduler process (export-process: false)",
              True: "plugin with its export process (the default, auto, with providers "
                    "from configuration)"}


@dataclass(frozen=True)
class Variant:
    """One way of running the plugin: its mode, and the source tree it comes from
    (None: this one); or, ``inert``, a plugin with its hooks and no work in them
    (``bench_inert``)."""

    export_process: bool
    tree: str | None = None
    inert: bool = False

    @property
    def name(self) -> str:
        if self.inert:
            return INERT_NAME
        where = f" from {self.tree}" if self.tree else ""
        return MODE_NAMES[self.export_process] + where


INERT_NAME = ("an inert plugin (OTelSpansPlugin's hooks doing nothing: what being a "
              "scheduler plugin costs)")


def rounds_within(pairs: int, deadline: float | None,
                  clock: Callable[[], float] = time.monotonic) -> Iterator[int]:
    """Round numbers ``0 .. pairs - 1``; with a ``deadline`` (``clock``'s time), none
    that would start after it or end past it, judged by the longest round so far (the
    first always runs): a leased machine's time limit cuts no round, and the report of
    the rounds run still comes."""
    longest = 0.0
    for i in range(pairs):
        start = clock()
        if i and deadline is not None and start + longest > deadline:
            print(f"  stopping after {i} of {pairs} rounds: the next (up to "
                  f"{longest:.0f} s, the longest so far) would end past --time-limit")
            return
        yield i
        longest = max(longest, clock() - start)


def part_throughput(pairs: int, scale: dict[str, Any], workers: int, threads: int,
                    variants: list[Variant], deadline: float | None = None,
                    settle_s: float = SETTLE_S) -> dict:
    """``variants``: the plugins to run, each against the same baselines; a round runs
    the baseline and each variant once, in rotating order. ``deadline``
    (``time.monotonic``): see :func:`rounds_within`."""
    ratios_by: dict[Variant, dict[str, dict[str, list[float]]]] = {v: {} for v in variants}
    stats_by: dict[Variant, list[dict]] = {v: [] for v in variants}
    for i in rounds_within(pairs, deadline):
        _round(i, pairs, scale, workers, threads, variants, ratios_by, stats_by,
               settle_s)
    out = {}
    for variant in variants:
        if len(variants) > 1:
            print(f"== {variant.name} ==")
        if variant.inert:  # no plugin figures: the ratios alone
            report_ratios(ratios_by[variant], export_process=False, own=False,
                          who="inert plugin")
            continue
        out = report_throughput(ratios_by[variant], stats_by[variant], scale,
                                variant.export_process)
    return out


def _round(i: int, pairs: int, scale: dict[str, Any], workers: int, threads: int,
           variants: list[Variant],
           ratios_by: dict[Variant, dict[str, dict[str, list[float]]]],
           stats_by: dict[Variant, list[dict]], settle_s: float = SETTLE_S) -> None:
    """Round ``i``: the baseline and each variant once, in rotating order."""
    configs: list[Variant | None] = [None, *variants]  # None: the baseline
    shift = i % len(configs)
    runs = {}
    for config in configs[shift:] + configs[:shift]:
        runs[config], stats = run_once(
            config is not None and not config.inert, scale, workers, threads,
            bool(config and config.export_process), config and config.tree,
            bool(config and config.inert), settle_s)
        if stats:
            stats_by[config].append(stats)
    base = runs[None]
    n_tasks = scale_tasks(scale)
    for variant in variants:
        for name, run in runs[variant].items():
            r = ratios_by[variant].setdefault(
                name, {"rate": [], "cpu": [], "cpu_less_gc": [], "loop": [],
                       "child": [], "tree": [], "own": [], "gc": [], "gc_base": [], "full": [],
                       "full_base": [], "workers": [], "cpu_for_speed": [],
                       "own_per_span": [], "base_cpu_us": []})
            r["rate"].append(run[0] / base[name][0])
            r["cpu"].append(run[1] / base[name][1])
            # the control: the workers' CPU per task, the same code on both sides;
            # away from 1 where the machine ran faster or slower for one run than
            # for the other (other tenants of its host)
            speed = run[7] / base[name][7]
            r["workers"].append(speed)
            # the CPU ratio with the machine's speed divided out (tasks/s is not
            # adjusted: it depends on the latencies between the processes as much
            # as on their CPU, and multiplying it by the control widened its spread)
            r["cpu_for_speed"].append(run[1] / base[name][1] / speed)
            # a full collection more or less in a workload's window is lumpy: the
            # ratio without either side's garbage collection
            r["cpu_less_gc"].append((run[1] - run[4]) / (base[name][1] - base[name][4]))
            r["loop"].append(run[2] / base[name][2])
            r["child"].append(run[3] / base[name][1])
            # what a user pays: the scheduler's whole process tree (the export
            # process shares the scheduler's container and CPU limit)
            r["tree"].append((run[1] + run[3]) / base[name][1])
            # the plugin's own CPU, measured where it runs, against the rest of
            # the same run's scheduler CPU: the direct part of the CPU ratio, free
            # of the spread between runs
            r["own"].append(run[6] / max(run[1] - run[6], 1e-12))
            # the same per span handed over, in µs: the plugin's cost follows the
            # spans, not the tasks (what a user's own tasks per span make of it)
            if run[8]:
                r["own_per_span"].append(run[6] * n_tasks[name] / run[8] * 1e6)
            r["base_cpu_us"].append(base[name][1] * 1e6)
            # garbage collection, both sides as fractions of the baseline's CPU
            r["gc"].append(run[4] / base[name][1])
            r["gc_base"].append(base[name][4] / base[name][1])
            r["full"].append(run[5])
            r["full_base"].append(base[name][5])
    print(f"  round {i + 1}/{pairs}: " + "; ".join(
        (f"{variant.name}: " if len(variants) > 1 else "") + ", ".join(
            f"{n} {runs[variant][n][0]:.0f}/{base[n][0]:.0f} tasks/s (CPU/task "
            f"x{runs[variant][n][1] / base[n][1]:.2f}, workers' x"
            f"{runs[variant][n][7] / base[n][7]:.2f})"
            for n in runs[variant])
        for variant in variants))


#: part 1's ratio lines, in order: the heading printed above each (None: none), the
#: label of each workload's line, and the key of its figures in a workload's ratios
RATIO_LINES: list[tuple[str | None, str, str]] = [
    (None, "tasks/s", "rate"),
    ("scheduler CPU seconds per task, plugin / baseline (<= 1.03 wanted)",
     "CPU s/task", "cpu"),
    ("CPU seconds per task of the scheduler's whole process tree (with the export "
     "process, which shares its container's CPU limit), plugin / baseline",
     "tree CPU", "tree"),
    ("the same less each side's garbage collection (see GC below: one full collection "
     "more or less in a workload moves the ratio by a few %)", "CPU less GC", "cpu_less_gc"),
    ("main thread (the event loop) CPU seconds per task, plugin / baseline; the rest of "
     "the plugin's CPU is on its own threads", "loop s/task", "loop"),
    ("the control: the workers' CPU seconds per task, plugin / baseline (the same code on "
     "both sides; away from 1 where the machine's speed moved between the two runs)",
     "workers CPU", "workers"),
    ("scheduler CPU seconds per task with the machine's speed divided out (each pair's "
     "ratio divided by its control), plugin / baseline", "adj. CPU", "cpu_for_speed"),
    ("the plugin's own CPU in the scheduler process (its hooks and callbacks on the event "
     "loop, and its threads), as a fraction of the rest of the same run's scheduler CPU: "
     "the direct part of the CPU ratio (<= 0.03 needed for 1.03), measured where it runs, "
     "so free of the spread between runs", "own CPU", "own"),
]


def report_ratios(ratios: dict[str, dict[str, list[float]]], export_process: bool,
                  own: bool = True, who: str = "plugin") -> None:
    """Part 1's ratio lines (``who``, the plugin or the inert plugin, / baseline);
    ``own``: with the plugin's own CPU (an inert plugin has none)."""
    print(f"1. throughput, {who} / baseline (tasks per second; >= 0.98 wanted)")
    for heading, label, key in RATIO_LINES:
        if key == "own" and not own:
            continue
        if heading:
            print(f"   {heading.replace('plugin / baseline', who + ' / baseline')}")
        for name, r in ratios.items():
            print(f"   {name:12s} {label:12s} {fmt_ratio(r[key])}")
    if own and any(r["own_per_span"] for r in ratios.values()):
        print("   the plugin's own CPU in the scheduler process per span handed over, µs "
              "(its cost follows the spans; the baseline's CPU per task is "
              "what it is measured against)")
        for name, r in ratios.items():
            if r["own_per_span"]:
                print(f"   {name:12s} {'own µs/span':12s} "
                      f"{fmt_ratio(r['own_per_span'])}; baseline CPU "
                      f"{statistics.median(r['base_cpu_us']):.0f} µs/task")
    if export_process:
        print("   export process CPU seconds per task, as a fraction of the baseline "
              "scheduler's (the work moved out of the scheduler process)")
        for name, r in ratios.items():
            print(f"   {name:12s} {'export CPU':12s} {fmt_ratio(r['child'])}")
    print("   garbage collection in the scheduler process: its CPU per task as a fraction "
          "of the baseline scheduler's CPU, plugin / baseline (medians), and full "
          "collections per workload, plugin / baseline (medians)")
    for name, r in ratios.items():
        print(f"   {name:12s} GC CPU       {statistics.median(r['gc']):.3f} / "
              f"{statistics.median(r['gc_base']):.3f}; full collections "
              f"{statistics.median(r['full']):g} / {statistics.median(r['full_base']):g}")


def report_throughput(ratios: dict[str, dict[str, list[float]]], plugin_stats: list[dict],
                      scale: dict[str, Any], export_process: bool) -> dict:
    sources = sorted({s["plugin_source"] for s in plugin_stats})
    print("   plugin code from " + ", ".join(sources))
    report_ratios(ratios, export_process)
    max_call = max(s["max_call_s"] for s in plugin_stats)
    total = statistics.median(s["total_call_s"] for s in plugin_stats)
    print("2. event-loop cost of the plugin (all hooks, wrappers and callbacks)")
    print(f"   longest single call {max_call * 1e3:.2f} ms (<= 5 ms wanted); "
          f"total per run (median) {total * 1e3:.1f} ms; "
          f"largest graph {largest_graph(scale)} tasks")
    by_hook: dict[str, float] = {}
    for s in plugin_stats:
        for hook, seconds in s["max_call_by_hook"].items():
            by_hook[hook] = max(by_hook.get(hook, 0.0), seconds)
    max_cpu = max(s["max_call_cpu_s"] for s in plugin_stats)
    print(f"   longest single call in event-loop thread CPU time {max_cpu * 1e3:.2f} ms "
          "(wall time less GIL and OS waits)")
    max_gc = max(s["max_gc_pause_s"] for s in plugin_stats)
    print(f"   longest garbage-collector pause in the scheduler process {max_gc * 1e3:.2f} ms "
          "(counted in whichever call triggered it)")
    own = max(s["max_call_cpu_less_gc_s"] for s in plugin_stats)
    own_by_hook: dict[str, float] = {}
    for s in plugin_stats:
        for hook, seconds in s["max_call_cpu_less_gc_by_hook"].items():
            own_by_hook[hook] = max(own_by_hook.get(hook, 0.0), seconds)
    print(f"   longest single call in event-loop thread CPU time less the garbage "
          f"collections it ran {own * 1e3:.2f} ms (<= 5 ms wanted); by place: " + ", ".join(
              f"{hook} {seconds * 1e3:.2f} ms" for hook, seconds in sorted(own_by_hook.items())))
    places = plugin_stats[0]["cpu_by_place"]
    cpu_by_place = {
        place: statistics.median(s["cpu_by_place"][place] for s in plugin_stats)
        for place in places
    }
    n_tasks = sum(n for n in scale_tasks(scale).values())
    checks = statistics.median(s["readiness_checks"] for s in plugin_stats)
    handed = statistics.median(s["handed_over"] for s in plugin_stats)
    print("   plugin CPU per run (median) by place: " + ", ".join(
        f"{place} {seconds:.3f} s ({seconds / max(handed, 1) * 1e6:.1f} µs per span)"
        for place, seconds in cpu_by_place.items())
        + f" ({sum(cpu_by_place.values()) / n_tasks * 1e6:.0f} µs per task over "
        f"{n_tasks} tasks)")
    print(f"   readiness checks per run (median) {checks:.0f} for {handed:.0f} spans "
          f"handed over ({checks / max(handed, 1):.1f} per span): passes look at "
          "spans that changed or are due, not at every open span")
    updates = statistics.median(s["metric_updates"] for s in plugin_stats)
    sdk_calls = statistics.median(s["metric_sdk_calls"] for s in plugin_stats)
    print(f"   metric updates per run (median) {updates:.0f}, handed to the OTel SDK as "
          f"{sdk_calls:.0f} counter adds (sums per series every send-interval)")
    print("   longest call by place: " + ", ".join(
        f"{hook} {seconds * 1e3:.2f} ms" for hook, seconds in sorted(by_hook.items())))
    lat = [x for s in plugin_stats for x in s["latencies"]]
    grace = plugin_stats[0]["grace_s"]
    print("4. latency, dask span done (the scheduler saw its last task finish, or its "
          "block's close notice where that came later) -> exporter")
    print(f"   {len(lat)} spans: median {statistics.median(lat):.2f} s, "
          f"p99 {sorted(lat)[int(0.99 * (len(lat) - 1))]:.2f} s, max {max(lat):.2f} s; "
          f"grace {grace:.2f} s (max <= grace + 1 s wanted)")
    by_workload: dict[str, list[float]] = {}
    for s in plugin_stats:
        for name, values in s["latencies_by_workload"].items():
            by_workload.setdefault(name, []).extend(values)
    print("   by workload: " + ", ".join(
        f"{name} median {statistics.median(v):.2f} s max {max(v):.2f} s ({len(v)})"
        for name, v in sorted(by_workload.items())))
    skew = sorted(x for s in plugin_stats for x in s["reported_end_skew"])
    if skew:
        print(f"   span ends as the workers reported them, less when the scheduler saw "
              f"the span done: median {statistics.median(skew):+.2f} s, min "
              f"{skew[0]:+.2f} s, max {skew[-1]:+.2f} s (their clock offset estimates)")
    return {"ratios": ratios, "max_call": max_call, "max_call_cpu_less_gc": own,
            "latencies": lat, "grace": grace}


# -- memory -----------------------------------------------------------------------------


@contextlib.contextmanager
def _environ(**values: str):
    """Set environment variables of this (benchmark) process for a while: the export
    process inherits the scheduler's environment."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


async def _memory(checkpoints: list[int], export_process: bool) -> list[dict[str, int]]:
    from distributed import Scheduler
    from distributed.scheduler import TaskGroup, TaskPrefix
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from dask_otel_spans import OTelSpansPlugin

    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(bench_preload.LatencyExporter()))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    out = []
    async with Scheduler(dashboard_address=":0", port=0) as s:
        if export_process:
            # the export process traces its allocations from its start
            with _environ(PYTHONTRACEMALLOC="1"):
                plugin = OTelSpansPlugin(export_process=True,
                                         providers="bench_preload:memory_child_providers",
                                         idle_timeout=0, export_delay=0)
                await s.register_scheduler_plugin(plugin=plugin, idempotent=False)
            if not plugin.destinations.get("export_process"):
                raise RuntimeError("the export process did not start")
        else:
            plugin = OTelSpansPlugin(tracer_provider=tracer_provider,
                                     meter_provider=meter_provider, idle_timeout=0,
                                     export_delay=0)
            await s.register_scheduler_plugin(plugin=plugin, idempotent=False)
        ext = s.extensions["spans"]
        tracemalloc.start()
        made = 0
        for target in checkpoints:
            while made < target:
                batch = min(1000, target - made)
                for _ in range(batch):
                    root = str(uuid.uuid4())
                    leaf = ext._ensure_span(("mem", f"span-{made}"),
                                            (root, str(uuid.uuid4())))
                    # (as distributed makes a span: with its first task group, here
                    # done, which the forwarder is told of as the transition hook
                    # would)
                    tg = TaskGroup(f"mem{made}", TaskPrefix("mem"))
                    tg.states["memory"] = 1
                    tg.span_id = leaf.id
                    leaf.groups.add(tg)
                    s.tasks[f"mem{made}-0"] = _MemTask(tg)
                    plugin.forwarder.task_moved(f"mem{made}-0", "processing",
                                                "memory", {})
                    del s.tasks[f"mem{made}-0"]
                    made += 1
                await plugin.flush()
            # (each span is emitted a grace period after it is done: the checkpoint
            # waits until none is open)
            deadline = time.monotonic() + 60
            while (plugin.open_span_count or plugin.ended_count < made) and (
                time.monotonic() < deadline
            ):
                await asyncio.sleep(0.2)
                await plugin.flush()
            gc.collect()
            snap = tracemalloc.take_snapshot().filter_traces(
                [tracemalloc.Filter(True, "*dask_otel_spans*")]
            )
            row = {
                "emitted": plugin.ended_count,
                "plugin_bytes": sum(stat.size for stat in snap.statistics("filename")),
                "open": plugin.open_span_count,
            }
            if export_process:
                child = plugin.export_figures().flat()
                row["child_traced_bytes"] = child.get("traced_bytes", 0)
                row["child_rss_bytes"] = child.get("rss_bytes", 0)
            out.append(row)
        tracemalloc.stop()
        await plugin.close()
    meter_provider.shutdown()
    tracer_provider.shutdown()
    return out


def part_memory(checkpoints: list[int], modes: list[bool]) -> dict[bool, list[dict]]:
    out = {}
    for mode in modes:
        rows = out[mode] = asyncio.run(_memory(checkpoints, mode))
        print(f"3. plugin memory, {MODE_NAMES[mode]} (tracemalloc, allocations made by "
              "dask_otel_spans still alive" + (
                  " in the scheduler process; the export process's Python allocations "
                  "(all of them) and resident set size)" if mode else ")"))
        for row in rows:
            line = (f"   after {row['emitted']:>7d} emitted spans: "
                    f"{row['plugin_bytes'] / 1024:8.1f} KiB ({row['open']} open)")
            if mode:
                line += (f"; export process {row['child_traced_bytes'] / 2**20:.2f} MiB "
                         f"traced, {row['child_rss_bytes'] / 2**20:.1f} MiB resident")
            print(line)
        if len(rows) >= 2:
            traced = (rows[-1].get("child_traced_bytes", 0)
                      / max(rows[-2].get("child_traced_bytes", 0), 1))
            resident = (rows[-1].get("child_rss_bytes", 0)
                        / max(rows[-2].get("child_rss_bytes", 0), 1))
            print(f"   last / second-to-last: "
                  f"{rows[-1]['plugin_bytes'] / max(rows[-2]['plugin_bytes'], 1):.3f}"
                  + (f"; export process traced {traced:.3f}, resident {resident:.3f}"
                     if mode else "")
                  + " (<= 1.10 wanted)")
            print("   " + memory_growth(rows[-2], rows[-1], "plugin_bytes",
                                        "in the scheduler process"))
            if mode:
                print("   " + memory_growth(rows[-2], rows[-1], "child_traced_bytes",
                                            "of the export process (traced)"))
    return out


#: Growth per emitted span under which memory counts as flat whatever its ratio: a
#: leak of one of the smallest objects per span (an int: 28 bytes) is above it
FLAT_BYTES_PER_SPAN = 1.0


def memory_growth(before: dict[str, int], after: dict[str, int], key: str,
                  where: str) -> str:
    """The growth of ``key`` bytes between two checkpoints, per span emitted between
    them, and whether that is flat: within 10 %, or under
    :data:`FLAT_BYTES_PER_SPAN` (a ratio of a few KiB moves by more than 10 % with
    the last objects a flush left, and says nothing of growth with the spans)."""
    grown = after[key] - before[key]
    spans = max(after["emitted"] - before["emitted"], 1)
    ratio = after[key] / max(before[key], 1)
    flat = ratio <= 1.10 or grown / spans < FLAT_BYTES_PER_SPAN
    return (f"growth {where}: {grown / 1024:+.1f} KiB over {spans} spans emitted, "
            f"{grown / spans:+.3f} bytes per span (flat: within 10 % or under "
            f"{FLAT_BYTES_PER_SPAN:g} byte per span): {'yes' if flat else 'NO'}")


# -- export cost ------------------------------------------------------------------------


def part_export_cost(repeat: int) -> dict:
    from dataclasses import dataclass as dc

    from distributed.spans import Span
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from dask_otel_spans.export.ender import SpanEnder
    from dask_otel_spans.export.traces import span_fields, subtree_summary
    from dask_otel_spans.export.writers import span_writer
    from dask_otel_spans.protocol.propagation import resolve_chain
    from dask_otel_spans.protocol.snapshots import snapshot_span

    @dc(eq=False)
    class Prefix:
        name: str

    @dc(eq=False)
    class Group:
        prefix: Any
        start: float
        stop: float
        nbytes_total: int = 1000
        duration: float = 1.0
        done: bool = True
        states: dict = field(default_factory=lambda: {"memory": 10, "erred": 0})

    sid = str(uuid.uuid4())
    sp = Span(("bench", "wide"), sid, None, [(0.0, 8)])
    sp.enqueued = 1.0
    activities = ["thread-cpu", "thread-noncpu", "executor", "other", "deserialize",
                  "disk-read", "disk-write", "compress", "decompress", "serialize"]
    for p in range(50):
        sp.groups.add(Group(Prefix(f"prefix-{p}"), 2.0 + p, 3.0 + p))
        for a in activities:
            sp._cumulative_worker_metrics["execute", f"prefix-{p}", a, "seconds"] = 0.1
            sp._cumulative_worker_metrics["execute", f"prefix-{p}", a, "bytes"] = 1000
    ids = resolve_chain([sid], {})
    t0 = time.perf_counter()
    for _ in range(repeat):
        snap = snapshot_span(sp)
    loop_side = (time.perf_counter() - t0) / repeat
    t0 = time.perf_counter()
    for _ in range(repeat):
        f = span_fields(snap, ids, subtree_summary(snap, {}), now=100.0, complete=True,
                        close_reason="client")
    translation = (time.perf_counter() - t0) / repeat
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(bench_preload.LatencyExporter()))
    ender = SpanEnder(span_writer(tracer_provider, owned=True))
    t0 = time.perf_counter()
    for _ in range(repeat):
        ender.export(f)
    sdk = (time.perf_counter() - t0) / repeat
    tracer_provider.shutdown()
    n_attrs = len(f.attributes) + sum(len(p.attributes) for p in f.prefixes)
    series = len(sp._cumulative_worker_metrics)
    print("5. export cost of one span with 50 task prefixes, 10 activities x 2 units each")
    print(f"   on the export session's thread (snapshot): {loop_side * 1e3:.3f} ms; on "
          f"the ender thread: translation {translation * 1e3:.2f} ms + SDK spans "
          f"{sdk * 1e3:.2f} ms")
    print(f"   1 + {len(f.prefixes)} OTel spans, {n_attrs} attributes; {series} metric "
          f"series (+1 idle) for this span")
    return {"loop_s": loop_side, "translation_s": translation, "sdk_s": sdk,
            "otel_spans": 1 + len(f.prefixes), "series": series}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run (CI)")
    parser.add_argument("--pairs", type=int, default=None,
                        help="rounds: each runs the baseline and the plugin once")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workloads", default=",".join(WORKLOADS),
                        help="comma-separated throughput workloads (default: the four "
                             "of the README's tables; also: wide, one span with "
                             "thousands of child spans; delayed-list and "
                             "nested-list, delayed and nested computed as lists of "
                             "collections, as in the runs before 2026-11-24 evening; "
                             "nested-x10, nested with 10 tasks per leaf span)")
    parser.add_argument("--export-process", action="store_true",
                        help="run the plugin with its export process, as the default "
                             "(auto) does with providers from configuration (parts 1 to "
                             "4); without it the benchmark's plugin exports in the "
                             "scheduler process, as with export-process: false or "
                             "providers given to the plugin")
    parser.add_argument("--both-modes", action="store_true",
                        help="run the plugin both ways (in the scheduler process and "
                             "with its export process) against the same baselines")
    parser.add_argument("--against", metavar="TREE", default=None,
                        help="also run the plugin from another source tree (e.g. a git "
                             "worktree of an older commit) in the same rounds, against "
                             "the same baselines: a before/after comparison that the "
                             "machine's drift between separate runs cannot blur (part 1 "
                             "and the parts it reports)")
    parser.add_argument("--inert", action="store_true",
                        help="also run an inert plugin (the plugin's hooks, doing "
                             "nothing) in the same rounds, against the same baselines: "
                             "what a scheduler plugin's presence costs, apart from what "
                             "this one does")
    parser.add_argument("--time-limit", metavar="SECONDS", type=float, default=None,
                        help="part 1 starts no round that would end more than SECONDS "
                             "after the benchmark's start (judged by its longest round "
                             "so far) and reports the rounds it ran: for a machine "
                             "leased for a fixed time, under a 'timeout' that would "
                             "otherwise cut the report; the later parts are not limited")
    parser.add_argument("--settle", metavar="SECONDS", type=float, default=None,
                        help="seconds after a workload's results during which the "
                             f"scheduler's CPU still counts for it (default {SETTLE_S}; "
                             "7.5 covers the idle-timeout that plain spans, as small's, "
                             "wait before they are exported)")
    parser.add_argument("--parts", default="throughput,memory,export",
                        help="comma-separated subset of throughput (parts 1, 2 and 4), "
                             "memory (part 3), export (part 5)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    unknown = parts - {"throughput", "memory", "export"}
    if unknown:
        parser.error(f"unknown part(s): {', '.join(sorted(unknown))}")
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = set(workloads) - set(ALL_WORKLOADS)
    if unknown or not workloads:
        parser.error(f"unknown or no workload(s): {', '.join(sorted(unknown))}")
    if args.quick:
        scale = {"futures": (20, 10), "interactive": (10, 10), "delayed": (20, 10),
                 "nested": (4, 3, 5),
                 "big-graph": (1000,), "wide": (200,), "small": (30, 2)}
        scale.update({"delayed-list": scale["delayed"], "nested-list": scale["nested"],
                      "nested-x10": scale["nested"]})
        pairs, checkpoints, repeat = args.pairs or 1, [20, 60, 120], 5
        settle_s = 1.5  # (past the 1 s grace: a smoke run's figures are not read)
    else:
        scale = {"futures": (200, 100), "interactive": (200, 10),
                 "delayed": (200, 100), "nested": (10, 10, 20),
                 "big-graph": (10_000,), "wide": (3_000,), "small": (300, 2)}
        scale.update({"delayed-list": scale["delayed"], "nested-list": scale["nested"],
                      "nested-x10": scale["nested"]})
        pairs, checkpoints, repeat = args.pairs or 3, [1000, 10_000, 100_000], 50
        settle_s = SETTLE_S if args.settle is None else args.settle
    scale = {name: shape for name, shape in scale.items() if name in workloads}
    modes = [False, True] if args.both_modes else [args.export_process]
    print(f"machine: {os.cpu_count()} cores; {args.workers} workers x {args.threads} "
          f"threads; {pairs} round(s), rotating order; "
          + " and ".join(MODE_NAMES[m] for m in modes))
    if "throughput" in parts:
        variants = [Variant(m) for m in modes]
        if args.against:
            tree = os.path.abspath(args.against)
            if not os.path.isdir(os.path.join(tree, "dask_otel_spans")):
                parser.error(f"--against: no dask_otel_spans package in {tree}")
            variants += [Variant(m, tree) for m in modes]
        if args.inert:
            variants.append(Variant(False, inert=True))
        deadline = None if args.time_limit is None else started + args.time_limit
        part_throughput(pairs, scale, args.workers, args.threads, variants, deadline,
                        settle_s)
    if "memory" in parts:
        part_memory(checkpoints, modes)
    if "export" in parts:
        part_export_cost(repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())

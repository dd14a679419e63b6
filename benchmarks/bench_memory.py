"""Memory by spans seen, between fresh clusters: what a long-lived cluster keeps per
span, with the package and without it.

    python benchmarks/bench_memory.py                  # scheduler: 10,000 spans, RSS every 1,000
    python benchmarks/bench_memory.py --quick          # smoke run: 300 spans
    python benchmarks/bench_memory.py --side worker    # worker: 100,000 tasks in 10,000 spans
    python benchmarks/bench_memory.py --side worker --tasks-per-span 1   # a span per task
    python benchmarks/bench_memory.py --side export    # an export process alone, fed blocks
    python benchmarks/bench_memory.py --plugin-only --spans 2000 --memray DIR  # memray

Scheduler side: a fresh ``dask scheduler`` (``--preload dask_otel_spans``: the package
as shipped, its export process, OTLP/gRPC to a receiver in another process that only
counts; or without it) and two ``dask worker`` processes of 2 threads, one cluster after
the other. The workload is ``--spans`` plain ``distributed.span`` blocks of 2 tasks,
each a task group of its own (``bench_scheduler``'s ``small``), in chunks of
``--every``; after each chunk, once every span was handed over and delivered
(``wait_for_export``; the baseline waits as long), the resident set size of the
scheduler process and of its export process. The slope is the least-squares fit of
RSS against spans from ``--warm-up`` spans on, in KiB per span.

Worker side: a fresh ``dask scheduler`` without the package and one ``dask worker``
of 2 threads, with ``--preload dask_otel_spans`` (exporters off: the package's own
memory, not an SDK's queue) or without; ``--tasks`` tiny tasks in spans of
``--tasks-per-span`` (a task group each), in chunks of ``--every-tasks``; after each
chunk the worker's RSS, and, with the package, how many task contexts it remembers.
Export side alone: a real export process (started as the plugin starts it, OTLP/gRPC
to the counting receiver), fed ``--spans`` blocks as the forwarder sends them for
``small`` (made up here: no scheduler, no workers) at ``--rate`` blocks a second; its
RSS every ``--every`` blocks, once they were handed over. What a real cluster's stream
adds to the export process shows as the difference to the scheduler side's figure.

RSS of a Python process moves with the allocator: read the slopes, not single
checkpoints.
"""
from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

import psutil

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))  # (support.blocks)

import dask  # noqa: E402
from bench_between import ReceiverProcess, _otlp_environ  # noqa: E402
from bench_scheduler import Cluster, small_workload  # noqa: E402
from distributed import Client  # noqa: E402
from distributed import span as dask_span  # noqa: E402

from dask_otel_spans import wait_for_export  # noqa: E402

KIB = 1024
#: exporters off on the worker side: the package's own memory
NO_EXPORT = {"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none",
             "OTEL_LOGS_EXPORTER": "none"}


def _rss(process: psutil.Process | None) -> int | None:
    try:
        return process.memory_info().rss if process is not None else None
    except (OSError, psutil.Error):
        return None


def _export_process(cluster: Cluster) -> psutil.Process | None:
    """The scheduler's export process (its child), when it has one."""
    children = cluster.scheduler.children(recursive=True)
    return children[0] if children else None


def slope(points: list[tuple[int, int | None]], warm_up: int) -> float | None:
    """Least-squares bytes per unit of ``(count, bytes)`` points from ``warm_up`` on."""
    xs, ys = zip(*[(x, y) for x, y in points if x >= warm_up and y is not None]) or (
        (), ())
    if len(xs) < 2:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else None


# -- the scheduler side ------------------------------------------------------------------


def _export_traced(dask_scheduler: Any) -> int | None:
    """run_on_scheduler: the export process's Python allocations alive, as it last
    reported them (``PYTHONTRACEMALLOC=1``), or None."""
    for plugin in dask_scheduler.plugins.values():
        figures = getattr(plugin, "export_figures", None)
        if figures is not None:
            return figures().flat().get("traced_bytes")
    return None


def scheduler_run(with_plugin: bool, spans: int, every: int, environ: dict[str, str],
                  wait: float, traced: bool = False,
                  tree: str | None = None) -> dict[str, Any]:
    """One fresh cluster: RSS of the scheduler (and its export process) every
    ``every`` spans; with ``traced``, the export process's Python allocations too."""
    preload = None
    if with_plugin:  # (bench_traced_child: its export process traced, not itself)
        preload = "bench_traced_child" if traced else "dask_otel_spans"
    cluster = Cluster(False, workers=2, threads=2, clock=False, environ=environ,
                      preload=preload, plugin_tree=tree)
    rows: list[dict[str, Any]] = []
    try:
        client = cluster.client
        small_workload(client, 20, 2)  # (warm: imports, first graphs)
        done = 0
        while True:
            if with_plugin:
                state = wait_for_export(client, timeout=120)
                handed = state.handed_over
            else:
                time.sleep(wait)  # (as long as the plugin side waits for idle spans)
                handed = None
            export = _export_process(cluster) if with_plugin else None
            rows.append({"spans": done, "scheduler": _rss(cluster.scheduler),
                         "export": _rss(export), "handed_over": handed,
                         "traced": (client.run_on_scheduler(_export_traced)
                                    if with_plugin and traced else None),
                         "load": os.getloadavg()[0]})
            print(f"    {done:>6} spans: scheduler {rows[-1]['scheduler'] / 2**20:7.1f} "
                  f"MiB" + (f", export process {rows[-1]['export'] / 2**20:7.1f} MiB, "
                            f"{handed} dask spans handed over" if with_plugin else "")
                  + (f", export process's Python allocations "
                     f"{rows[-1]['traced'] / 2**20:7.2f} MiB" if rows[-1]["traced"]
                     else ""), flush=True)
            if done >= spans:
                break
            n = min(every, spans - done)
            small_workload(client, n, 2)
            done += n
    finally:
        cluster.close()
    return {"with_plugin": with_plugin, "rows": rows}


# -- the export process alone -----------------------------------------------------------


def _block_messages(i: int, at: float) -> list[Any]:
    """The messages of block ``i`` of ``small``, done at ``at``: a root span, its
    child with a task group of 2 tasks of a prefix of its own, a graph, a
    heartbeat's deltas."""
    from support.blocks import block_messages

    return block_messages(i, at, 1_000_000 + i, ("small", f"step-{i}"), f"s{i}",
                          "Client-bench")


def export_run(spans: int, every: int, rate: float, environ: dict[str, str]
               ) -> dict[str, Any]:
    """A real export process fed ``spans`` blocks at ``rate`` a second: its RSS every
    ``every`` blocks."""
    from dask_otel_spans.config import PluginConfig
    from dask_otel_spans.protocol import events
    from dask_otel_spans.transport.choice import ChildTransport
    from dask_otel_spans.transport.sender import ChildSender
    from dask_otel_spans.transport.spec import PipelineSpec
    from dask_otel_spans.transport.supervisor import ChildSupervisor

    # (done seconds before they are sent: handed over at the next pass)
    config = PluginConfig.from_dask_config(idle_timeout=0, export_delay=0)
    supervisor = ChildSupervisor(PipelineSpec(config, environ=environ), nice=10,
                                 cpu_policy="idle")
    supervisor.launch()
    sender = ChildSender(supervisor)
    sender.start()
    transport = ChildTransport(sender)
    transport.send([events.worker_count(2)])
    child = supervisor.live_child()
    process = psutil.Process(child.pid) if child is not None else None
    rows: list[dict[str, Any]] = []
    done, batch = 0, 50
    try:
        while True:
            transport.flush(60)
            rows.append({"spans": done, "export": _rss(process), "scheduler": None,
                         "traced": None})
            print(f"    {done:>6} spans: export process "
                  f"{rows[-1]['export'] / 2**20:7.1f} MiB, "
                  f"{transport.figures().flat().get('handed_over')} dask spans handed "
                  f"over", flush=True)
            if done >= spans:
                break
            upto = min(spans, done + every)
            while done < upto:
                at = time.time() - 10
                messages: list[Any] = []
                for _ in range(min(batch, upto - done)):
                    messages += _block_messages(done, at)
                    done += 1
                transport.send(messages)
                time.sleep(batch / rate)
    finally:
        transport.stop(10)
    return {"with_plugin": True, "rows": rows}


def report_scheduler(runs: list[dict[str, Any]], warm_up: int) -> None:
    for run in runs:
        label = "with the plugin" if run["with_plugin"] else "no plugin"
        rows = run["rows"]
        for key in ("scheduler", "export", "traced"):
            points = [(r["spans"], r[key]) for r in rows]
            if all(y is None for _, y in points):
                continue
            fit = slope(points, warm_up)
            first = next(r for r in rows if r["spans"] >= warm_up)
            grown = (rows[-1][key] - first[key]) / max(1, rows[-1]["spans"] - first["spans"])
            where = {"scheduler": "scheduler", "export": "its export process",
                     "traced": "its export process's Python allocations"}[key]
            print(f"  {label}, {where}: {rows[0][key] / 2**20:.1f} MiB at start, "
                  f"{rows[-1][key] / 2**20:.1f} MiB after {rows[-1]['spans']} spans; "
                  f"past {warm_up}: {fit / KIB if fit is not None else float('nan'):.3f} "
                  f"KiB per span (fit), {grown / KIB:.3f} (end points)")


# -- the worker side ---------------------------------------------------------------------


def _inc(x: int) -> int:
    return x + 1


def _contexts_remembered(dask_worker: Any) -> int | None:
    """run on the worker: the task contexts the worker plugin remembers."""
    for plugin in dask_worker.plugins.values():
        contexts = getattr(plugin, "contexts", None)
        if contexts is not None:
            return len(contexts)
    return None


def worker_run(with_plugin: bool, tasks: int, per_span: int, every: int) -> dict[str, Any]:
    """One fresh cluster of one worker: its RSS every ``every`` tasks."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(NO_EXPORT, PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), HERE,
                                                      *sys.path]))
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        file = os.path.join(tmp, "scheduler.json")
        worker_cmd = [sys.executable, "-m", "dask", "worker", "--scheduler-file", file,
                      "--nthreads", "2", "--no-dashboard", "--no-nanny"]
        if with_plugin:
            worker_cmd += ["--preload", "dask_otel_spans"]
        procs = [subprocess.Popen(
            [sys.executable, "-m", "dask", "scheduler", "--host", "127.0.0.1", "--port",
             "0", "--no-dashboard", "--scheduler-file", file],
            env=env, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
        procs.append(subprocess.Popen(worker_cmd, env=env, cwd=tmp,
                                      stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
        try:
            client = Client(scheduler_file=file, timeout=60)
            client.wait_for_workers(1, timeout=60)
            process = psutil.Process(procs[1].pid)
            _worker_chunks(client, process, with_plugin, tasks, per_span, every, rows)
            client.close()
        finally:
            for p in reversed(procs):
                p.terminate()
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
    return {"with_plugin": with_plugin, "rows": rows}


def _worker_chunks(client: Client, process: psutil.Process, with_plugin: bool,
                   tasks: int, per_span: int, every: int,
                   rows: list[dict[str, Any]]) -> None:
    done = spans = 0
    while True:
        client.run(gc.collect)
        remembered = next(iter(client.run(_contexts_remembered).values()))
        rows.append({"tasks": done, "spans": spans, "rss": _rss(process),
                     "contexts": remembered})
        print(f"    {done:>7} tasks, {spans:>6} spans: worker "
              f"{rows[-1]['rss'] / 2**20:7.1f} MiB"
              + (f", {remembered} task contexts remembered" if with_plugin else ""),
              flush=True)
        if done >= tasks:
            return
        chunk = min(every, tasks - done)
        futures = []
        for _ in range(0, chunk, per_span):
            with dask_span("worker-bench", f"step-{spans}"):
                name = f"w{spans}-{uuid.uuid4().hex}"
                futures += client.compute([
                    dask.delayed(_inc)(j, dask_key_name=(name, j))
                    for j in range(per_span)])
            spans += 1
        client.gather(futures)
        del futures
        done += chunk


def report_worker(runs: list[dict[str, Any]], warm_up: int) -> None:
    base = {False: None, True: None}
    for run in runs:
        label = "with the plugin" if run["with_plugin"] else "no plugin"
        rows = run["rows"]
        per_task = slope([(r["tasks"], r["rss"]) for r in rows], warm_up)
        base[run["with_plugin"]] = per_task
        last = rows[-1]
        spans_per_task = last["spans"] / max(1, last["tasks"])
        print(f"  worker, {label}: {rows[0]['rss'] / 2**20:.1f} MiB at start, "
              f"{last['rss'] / 2**20:.1f} MiB after {last['tasks']} tasks "
              f"({last['spans']} spans); past {warm_up} tasks: "
              f"{per_task if per_task is not None else float('nan'):.1f} bytes per task, "
              f"{(per_task or 0) / max(spans_per_task, 1e-9):.1f} bytes per span (fit)"
              + (f"; task contexts remembered at the end: {last['contexts']}"
                 if run["with_plugin"] else ""))
    if base[True] is not None and base[False] is not None:
        print(f"  the plugin's own: {base[True] - base[False]:+.1f} bytes per task "
              f"(with less without)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", choices=("scheduler", "worker", "export"),
                        default="scheduler")
    parser.add_argument("--rate", type=float, default=20.0,
                        help="--side export: blocks sent a second")
    parser.add_argument("--spans", type=int, default=10_000)
    parser.add_argument("--every", type=int, default=1000)
    parser.add_argument("--warm-up", type=int, default=None,
                        help="fit from this many spans (tasks on the worker side) on; "
                             "default: 2,000 spans / 20,000 tasks")
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--tasks-per-span", type=int, default=10)
    parser.add_argument("--every-tasks", type=int, default=10_000)
    parser.add_argument("--wait", type=float, default=7.0,
                        help="baseline: seconds after each chunk (the plugin side waits "
                             "for its idle spans, 5 s)")
    parser.add_argument("--plugin-only", action="store_true",
                        help="only the cluster with the package")
    parser.add_argument("--baseline-only", action="store_true",
                        help="only the cluster without the package")
    parser.add_argument("--traced", action="store_true",
                        help="the export process's Python allocations too (its "
                             "PYTHONTRACEMALLOC=1: slower, more memory)")
    parser.add_argument("--tree", default=None, metavar="TREE",
                        help="the package of this source tree (e.g. a worktree of an "
                             "earlier commit) in the scheduler and its export process")
    parser.add_argument("--memray", default=None, metavar="DIR",
                        help="the export process under memray (native stacks, "
                             "aggregated), its capture written to DIR when it ends; "
                             "read with benchmarks/memray_live.py")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 300 spans in chunks of 100 (3,000 tasks)")
    args = parser.parse_args(argv)
    if args.quick:
        args.spans, args.every, args.wait = 300, 100, 1.0
        args.tasks, args.every_tasks = 3000, 1000
    logging.getLogger("dask_otel_spans").setLevel(logging.ERROR)
    if args.memray:  # (its sitecustomize on the path the clusters' processes inherit)
        os.makedirs(args.memray, exist_ok=True)
        os.environ["DASK_OTEL_SPANS_BENCH_MEMRAY"] = os.path.abspath(args.memray)
        sys.path.insert(0, os.path.join(HERE, "memray_child"))
    modes = (True,) if args.plugin_only else (False,) if args.baseline_only else (
        False, True)
    print(f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; "
          f"side: {args.side}")
    runs = []
    if args.side == "export":
        warm_up = args.warm_up if args.warm_up is not None else min(2000, args.spans // 3)
        receiver = ReceiverProcess()
        try:
            print(f"  an export process alone: {args.spans} blocks at {args.rate:g} a "
                  f"second, RSS every {args.every}", flush=True)
            runs.append(export_run(args.spans, args.every, args.rate,
                                   _otlp_environ(receiver.port)))
        finally:
            receiver.stop()
        report_scheduler(runs, warm_up)
    elif args.side == "scheduler":
        warm_up = args.warm_up if args.warm_up is not None else min(2000, args.spans // 3)
        receiver = ReceiverProcess()
        try:
            environ = _otlp_environ(receiver.port)
            for with_plugin in modes:
                print(f"  {'with the plugin' if with_plugin else 'no plugin'}: "
                      f"{args.spans} spans of 2 tasks, RSS every {args.every}", flush=True)
                runs.append(scheduler_run(with_plugin, args.spans, args.every, environ,
                                          args.wait, args.traced,
                                          os.path.abspath(args.tree) if args.tree
                                          else None))
            print(f"receiver: {json.dumps(receiver.counts())}")
        finally:
            receiver.stop()
        report_scheduler(runs, warm_up)
    else:
        warm_up = args.warm_up if args.warm_up is not None else min(20_000,
                                                                      args.tasks // 3)
        for with_plugin in modes:
            print(f"  {'with the plugin' if with_plugin else 'no plugin'}: {args.tasks} "
                  f"tasks, {args.tasks_per_span} per span, RSS every {args.every_tasks}",
                  flush=True)
            runs.append(worker_run(with_plugin, args.tasks, args.tasks_per_span,
                                   args.every_tasks))
        report_worker(runs, warm_up)
    return 0


if __name__ == "__main__":
    sys.exit(main())

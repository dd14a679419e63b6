"""What the worker side (``dask worker --preload dask_otel_spans``) costs per task.

    python benchmarks/bench_worker.py              # both parts
    python benchmarks/bench_worker.py --quick      # smoke run
    python benchmarks/bench_worker.py --parts micro

1. micro: the plugin's own work per task, measured where it runs: ``Worker.execute``
   wrapped by the plugin (the task's context looked up in its cache, attached and
   detached around the execution) against the same ``execute`` unwrapped, each call
   in an asyncio task of its own as distributed runs it; best of ``--repeat``, CPU
   time of this thread. And the log record factory's cost per record made.
2. processes: real ``dask scheduler`` and two ``dask worker`` processes, the workers
   started with and without ``--preload dask_otel_spans`` in alternating rounds
   (no in-task spans; exporters off), the same workload of tiny tasks in 200 spans:
   tasks/s and the workers' CPU per task. Whole-process figures on a shared machine
   move by tens of percent between rounds: they catch large regressions only.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import subprocess
import sys
import time
import timeit
import uuid
from types import SimpleNamespace
from typing import Any

import psutil
from distributed import Client

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from bench_scheduler import process_cpu_seconds  # noqa: E402

from dask_otel_spans import OTelWorkerPlugin, span  # noqa: E402

#: exporters off: the worker side's own work only (no in-task spans are made)
NO_EXPORT = {"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"}


# -- 1. micro ------------------------------------------------------------------------


class _Worker:
    """The parts of a ``Worker`` the plugin touches; ``execute`` does nothing."""

    def __init__(self, tasks: dict[Any, Any]):
        self.address, self.name = "tcp://127.0.0.1:1", "bench"
        self.state = SimpleNamespace(tasks=tasks)

    async def execute(self, key: Any, *, stimulus_id: str) -> None:
        return None


def _task(span_id: str) -> Any:
    return SimpleNamespace(
        span_id=span_id, prefix="inc",
        annotations={"span": {"name": ("etl",), "ids": (span_id,)}, "otel": {
            span_id: {"traceparent":
                      "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}},
    )


async def _cpu_per_call(execute: Any, key: Any, calls: int) -> float:
    """CPU seconds per call of ``execute``, each in an asyncio task of its own."""
    start = time.thread_time()
    for _ in range(calls):
        await asyncio.create_task(execute(key, stimulus_id="s"))
    return (time.thread_time() - start) / calls


async def micro(calls: int, repeat: int) -> dict[str, float]:
    key = "inc-1"
    plain = _Worker({key: _task(str(uuid.uuid4()))})
    wrapped = _Worker({key: _task(str(uuid.uuid4()))})
    plugin = OTelWorkerPlugin(environ=NO_EXPORT)
    plugin.setup(wrapped)
    try:
        base, with_plugin = [], []
        for _ in range(repeat):  # alternating
            base.append(await _cpu_per_call(plain.execute, key, calls))
            with_plugin.append(await _cpu_per_call(wrapped.execute, key, calls))
        made = logging.getLogRecordFactory()  # (the plugin's)
        args = ("bench", logging.INFO, __file__, 1, "x", (), None)
        factory = min(timeit.repeat(lambda: made(*args), number=calls,
                                    repeat=repeat, timer=time.thread_time)) / calls
        plain_record = min(timeit.repeat(lambda: logging.LogRecord(*args),
                                         number=calls, repeat=repeat,
                                         timer=time.thread_time)) / calls
    finally:
        await plugin.teardown(wrapped)
    out = {
        "execute_us": min(base) * 1e6,
        "execute_with_plugin_us": min(with_plugin) * 1e6,
        "per_task_us": (min(with_plugin) - min(base)) * 1e6,
        "per_log_record_us": (factory - plain_record) * 1e6,
    }
    print(f"micro (best of {repeat} x {calls} calls, CPU of this thread):")
    print(f"   Worker.execute stand-in alone: {out['execute_us']:.2f} µs; wrapped by "
          f"the plugin: {out['execute_with_plugin_us']:.2f} µs")
    print(f"   the plugin's work per task: {out['per_task_us']:.2f} µs")
    print(f"   per log record made: {out['per_log_record_us']:.2f} µs")
    return out


# -- 2. processes ----------------------------------------------------------------------


def inc(x: int) -> int:
    return x + 1


class Workers:
    """``dask scheduler`` (no plugin) and ``dask worker`` processes, preloaded or not."""

    def __init__(self, preload: bool, workers: int, threads: int):
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        env.update(NO_EXPORT, PYTHONPATH=os.pathsep.join([ROOT, HERE, *sys.path]))
        self.file = os.path.join(HERE, f".workers-{os.getpid()}-{int(preload)}.json")
        self.procs = [subprocess.Popen(
            [sys.executable, "-m", "dask", "scheduler", "--host", "127.0.0.1",
             "--port", "0", "--no-dashboard", "--scheduler-file", self.file],
            env=env, cwd=HERE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
        extra = ["--preload", "dask_otel_spans"] if preload else []
        for _ in range(workers):
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "dask", "worker", "--scheduler-file", self.file,
                 "--nthreads", str(threads), "--no-dashboard", "--no-nanny", *extra],
                env=env, cwd=HERE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        self.client = Client(scheduler_file=self.file, timeout=60)
        self.client.wait_for_workers(workers, timeout=60)

    def workers_cpu(self) -> float:
        return sum(process_cpu_seconds(psutil.Process(p.pid)) for p in self.procs[1:])

    def close(self) -> None:
        self.client.close()
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        try:
            os.remove(self.file)
        except OSError:
            pass


def run_workload(client: Client, n_spans: int, per_span: int) -> int:
    """``n_spans`` spans of ``per_span`` tiny tasks, a TaskGroup per span."""
    futures = []
    for i in range(n_spans):
        with span(f"span {i}"):
            futures += client.map(inc, range(per_span),
                                  key=[(f"inc-{i}", j) for j in range(per_span)])
    client.gather(futures)
    return len(futures)


def processes(rounds: int, n_spans: int, per_span: int) -> dict[str, float]:
    figures: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    for r in range(rounds):
        for preload in ([False, True] if r % 2 == 0 else [True, False]):
            cluster = Workers(preload, workers=2, threads=2)
            try:
                run_workload(cluster.client, 5, 10)  # warm-up
                cpu0, t0 = cluster.workers_cpu(), time.perf_counter()
                n = run_workload(cluster.client, n_spans, per_span)
                wall, cpu = time.perf_counter() - t0, cluster.workers_cpu() - cpu0
            finally:
                cluster.close()
            figures[preload].append((n / wall, cpu / n))
            print(f"   round {r + 1}/{rounds}, {'with' if preload else 'without'} "
                  f"--preload: {n / wall:.0f} tasks/s, workers' CPU "
                  f"{cpu / n * 1e6:.0f} µs/task")
    med = {p: (statistics.median(t for t, _ in v), statistics.median(c for _, c in v))
           for p, v in figures.items()}
    out = {"tasks_per_s_ratio": med[True][0] / med[False][0],
           "worker_cpu_per_task_us": med[True][1] * 1e6,
           "worker_cpu_per_task_us_without": med[False][1] * 1e6}
    print(f"processes (median of {rounds} rounds each): tasks/s with/without "
          f"{out['tasks_per_s_ratio']:.3f}; workers' CPU per task "
          f"{out['worker_cpu_per_task_us']:.0f} / "
          f"{out['worker_cpu_per_task_us_without']:.0f} µs")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument("--parts", default="micro,processes")
    parser.add_argument("--calls", type=int, default=None)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args(argv)
    parts = set(args.parts.split(","))
    print(f"machine: {os.cpu_count()} cores")
    if "micro" in parts:
        asyncio.run(micro(args.calls or (2000 if args.quick else 50_000), args.repeat))
    if "processes" in parts:
        shape = (5, 10) if args.quick else (200, 100)
        processes(args.rounds or (1 if args.quick else 4), *shape)
    return 0


if __name__ == "__main__":
    sys.exit(main())

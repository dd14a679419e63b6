"""Duplicates after a stopped, then killed export process on a loaded machine: how many
times the receiver gets each OTel span.

    python benchmarks/bench_duplicates.py --spans 400 --stop 5 --load 2 --runs 3

A ``dask scheduler --preload dask_otel_spans`` (its export process as shipped, OTLP/gRPC
to a receiver in this process that counts every span id it gets, a spool directory of
its own) and a ``dask worker``; ``--load`` processes spin on the CPUs meanwhile (a busy
machine). Per run: a warm-up span is exported; the export process is stopped (SIGSTOP)
while ``--spans`` one-task dask spans run and end; after ``--stop`` seconds it goes on
(SIGCONT), and ``--kill-after`` seconds later it is killed (SIGKILL); one more span
makes the scheduler start a new one, and ``wait_for_export`` waits for everything.
Reported per run: the OTel spans received, the distinct span ids among them, the
duplicates (received less distinct) and the most copies of one span, whether every
dask span arrived, the plugin's ``ExportState.resent`` (spans sent again after an
attempt got no answer in time: with the fix, every duplicate is one of those) and its
WARNING lines."""
from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent import futures
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


class SpanCounter:
    """An OTLP/gRPC receiver that counts every span id it gets (and the names)."""

    def __init__(self) -> None:
        import grpc
        from opentelemetry.proto.collector.metrics.v1 import (
            metrics_service_pb2,
            metrics_service_pb2_grpc,
        )
        from opentelemetry.proto.collector.trace.v1 import (
            trace_service_pb2,
            trace_service_pb2_grpc,
        )

        self.copies: collections.Counter[bytes] = collections.Counter()
        self.names: dict[bytes, str] = {}
        self.requests = 0
        self._lock = threading.Lock()
        receiver = self

        class Traces(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request, context):
                with receiver._lock:
                    receiver.requests += 1
                    for rs in request.resource_spans:
                        for ss in rs.scope_spans:
                            for sp in ss.spans:
                                receiver.copies[sp.span_id] += 1
                                receiver.names[sp.span_id] = sp.name
                return trace_service_pb2.ExportTraceServiceResponse()

        class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
            def Export(self, request, context):
                return metrics_service_pb2.ExportMetricsServiceResponse()

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), self.server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(),
                                                                     self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def figures(self) -> dict[str, Any]:
        with self._lock:
            copies = dict(self.copies)
            names = dict(self.names)
        received = sum(copies.values())
        twice = collections.Counter(
            "dask" if names[i].startswith("stopped-") else
            "prefix" if names[i].startswith("stopped") else names[i]
            for i, n in copies.items() if n > 1)
        return {"requests": self.requests, "received": received,
                "duplicated_by_kind": dict(twice),
                "distinct": len(copies), "duplicates": received - len(copies),
                "most_copies": max(copies.values(), default=0),
                "names": collections.Counter(names.values())}

    def stop(self) -> None:
        self.server.stop(grace=None)


def spin() -> None:  # pragma: no cover - a load process
    while True:
        pass


def export_child(scheduler_pid: int, exclude: int | None = None) -> int | None:
    """The pid of the scheduler's export process (not ``exclude``)."""
    import psutil

    for child in psutil.Process(scheduler_pid).children():
        try:
            if ("dask_otel_spans.transport.child" in " ".join(child.cmdline())
                    and child.pid != exclude and child.status() != "zombie"):
                return child.pid
        except psutil.Error:
            continue
    return None


def wait(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(0.05)
    raise RuntimeError(f"no {what} within {timeout} s")


def one_run(args: argparse.Namespace) -> dict[str, Any]:
    from distributed import Client

    from dask_otel_spans import span, wait_for_export

    receiver = SpanCounter()
    spool = tempfile.mkdtemp(prefix="bench-duplicates-")
    scheduler_file = os.path.join(spool, "scheduler.json")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update({
        "PYTHONPATH": os.pathsep.join([ROOT, *sys.path]),
        "OTEL_TRACES_EXPORTER": "otlp", "OTEL_METRICS_EXPORTER": "none",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.port}",
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "DASK_OTEL_SPANS__EXPORT_DELAY": "0.2s",
        "DASK_OTEL_SPANS__SPOOL__DIRECTORY": os.path.join(spool, "spool"),
        **dict(v.split("=", 1) for v in args.env),
    })
    procs = [subprocess.Popen(
        [sys.executable, "-m", "dask", "scheduler", "--host", "127.0.0.1", "--port", "0",
         "--no-dashboard", "--scheduler-file", scheduler_file,
         "--preload", "dask_otel_spans"],
        env=env, cwd=spool, stdout=subprocess.DEVNULL,
        stderr=open(os.path.join(spool, "scheduler.log"), "w"))]
    procs.append(subprocess.Popen(
        [sys.executable, "-m", "dask", "worker", "--scheduler-file", scheduler_file,
         "--nthreads", "2", "--no-dashboard", "--no-nanny"],
        env=env, cwd=spool, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    wait(lambda: os.path.exists(scheduler_file), 60, "scheduler")
    try:
        with Client(scheduler_file=scheduler_file, timeout=60) as client:
            client.wait_for_workers(1, timeout=60)
            with span("warm-up"):
                client.submit(abs, -1, key="warm-1").result()
            wait_for_export(client, timeout=60)
            first = wait(lambda: export_child(procs[0].pid), 30, "export process")
            t0 = time.monotonic()
            os.kill(first, signal.SIGSTOP)
            try:
                running = []
                for i in range(args.spans):
                    with span(f"stopped-{i}"):
                        running.append(client.submit(abs, -i, key=f"stopped{i}-1"))
                client.gather(running)
                time.sleep(max(0.0, args.stop - (time.monotonic() - t0)))
            finally:
                os.kill(first, signal.SIGCONT)
            stopped_for = time.monotonic() - t0
            time.sleep(args.kill_after)
            os.kill(first, signal.SIGKILL)
            time.sleep(1.0)
            with span("after"):
                client.submit(abs, -1, key="after-1").result()
            state = wait_for_export(client, timeout=120)
            time.sleep(args.settle)  # (late copies, if any)
            state = wait_for_export(client, timeout=60)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        receiver.stop()
    figures = receiver.figures()
    names = figures.pop("names")
    with open(os.path.join(spool, "scheduler.log")) as f:
        log = f.read()
    return {
        **figures,
        "stopped_s": round(stopped_for, 1),
        "dask_spans_arrived": sum(1 for i in range(args.spans)
                                  if names.get(f"stopped-{i}")),
        "resent": getattr(state, "resent", None),
        "delivered": state.traces_delivered,
        # (the WARNING of a resend, said once per outage by each export process)
        "resend_lines": log.count("got no answer within its"),
        "restarts": log.count("starting a new export process"),
        "spool": spool,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=400)
    parser.add_argument("--stop", type=float, default=5.0,
                        help="seconds the export process is stopped")
    parser.add_argument("--kill-after", type=float, default=3.0,
                        help="seconds after it goes on that it is killed")
    parser.add_argument("--load", type=int, default=2,
                        help="processes spinning on the CPUs meanwhile")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--settle", type=float, default=5.0)
    parser.add_argument("--env", action="append", default=[],
                        help="NAME=VALUE for the cluster's processes")
    args = parser.parse_args()
    import multiprocessing

    load = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.load)]
    for p in load:
        p.start()
    try:
        for run in range(args.runs):
            result = one_run(args)
            print(json.dumps({"run": run, **result}), flush=True)
    finally:
        for p in load:
            p.kill()


if __name__ == "__main__":
    main()

"""Delivery through a collector outage: the exporting process's memory and CPU while
spans end at a steady rate and the OTLP receiver is away, and how fast the backlog
drains once it is back.

    python benchmarks/bench_delivery.py --rate 500 --before 5 --outage 20 --after 30

A child process builds the providers as the export process does (``OTEL_*`` to an
OTLP/gRPC receiver, the package's delivery and spool) and ends ``--rate`` spans a second
(in batches every 50 ms, each span with a dozen attributes, like a prefix span); this
process runs the receiver, stops it for ``--outage`` seconds and starts it again. Every
half second the child reports its CPU seconds, resident memory and the delivery's
figures. The span tree and readiness tracking of a real export process are left out:
their cost does not depend on the collector."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from concurrent import futures
from typing import Any

PHASES = ("before", "outage", "after")


def child(args: argparse.Namespace) -> None:
    import psutil

    from dask_otel_spans.sdk.delivery import Delivery
    from dask_otel_spans.sdk.providers import resolve_providers
    from dask_otel_spans.sdk.spool import Spool

    environ = {
        "OTEL_TRACES_EXPORTER": "otlp", "OTEL_METRICS_EXPORTER": "none",
        "OTEL_EXPORTER_OTLP_ENDPOINT": args.endpoint, "OTEL_EXPORTER_OTLP_INSECURE": "true",
        "OTEL_BSP_SCHEDULE_DELAY": "500",
    }
    delivery = Delivery(Spool(args.spool, args.max_memory, args.max_disk))
    providers = resolve_providers(environ=environ, use_global=False, delivery=delivery)
    tracer = providers.tracer_provider.get_tracer("bench")
    process = psutil.Process()
    ended = 0
    stop = time.monotonic() + args.duration

    def report(now: float) -> None:
        figures = providers.delivery()["traces"]
        print(json.dumps({
            "t": now, "cpu": sum(process.cpu_times()[:2]),
            "rss": process.memory_info().rss, "ended": ended,
            "delivered": figures.delivered, "held": figures.held,
            "spooled": figures.spooled, "dropped": figures.dropped,
        }), flush=True)

    next_report = next_batch = time.monotonic()
    attributes = {f"dask.metrics.activity{i}.seconds": float(i) for i in range(12)}
    while time.monotonic() < stop:
        now = time.monotonic()
        if now >= next_batch:
            for _ in range(max(1, int(args.rate * 0.05))):
                with tracer.start_as_current_span("prefix", attributes=attributes):
                    pass
                ended += 1
            next_batch += 0.05
        if now >= next_report:
            report(now)
            next_report += 0.5
        time.sleep(max(0.0, min(next_batch, next_report) - time.monotonic()))
    providers.tracer_provider.force_flush()
    delivery.drain(10.0)
    report(time.monotonic())
    delivery.close(1.0)
    os._exit(0)


class CountingReceiver:
    """An OTLP/gRPC receiver that counts the spans it got, and the trace and metric
    export requests (the metrics' points are not looked at)."""

    def __init__(self, port: int = 0):
        import grpc
        from opentelemetry.proto.collector.metrics.v1 import (
            metrics_service_pb2,
            metrics_service_pb2_grpc,
        )
        from opentelemetry.proto.collector.trace.v1 import (
            trace_service_pb2,
            trace_service_pb2_grpc,
        )

        self.spans = self.trace_requests = self.metric_requests = 0
        receiver = self

        class Service(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request, context):
                receiver.trace_requests += 1
                receiver.spans += sum(len(ss.spans) for rs in request.resource_spans
                                      for ss in rs.scope_spans)
                return trace_service_pb2.ExportTraceServiceResponse()

        class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
            def Export(self, request, context):
                receiver.metric_requests += 1
                return metrics_service_pb2.ExportMetricsServiceResponse()

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), self.server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(),
                                                                     self.server)
        self.port = self.server.add_insecure_port(f"127.0.0.1:{port}")
        self.server.start()

    def stop(self) -> None:
        self.server.stop(grace=None)


def run(args: argparse.Namespace) -> dict[str, Any]:
    import tempfile

    receiver = CountingReceiver()
    port, received = receiver.port, 0
    duration = args.before + args.outage + args.after
    spool = tempfile.mkdtemp(prefix="bench-delivery-")
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", "--endpoint", f"http://127.0.0.1:{port}",
         "--rate", str(args.rate), "--duration", str(duration), "--spool", spool,
         "--max-memory", str(args.max_memory), "--max-disk", str(args.max_disk)],
        stdout=subprocess.PIPE, text=True)
    reports: list[dict[str, Any]] = []
    reader = threading.Thread(
        target=lambda: reports.extend(json.loads(line) for line in proc.stdout), daemon=True)
    reader.start()
    t0 = time.monotonic()
    time.sleep(args.before)
    received += receiver.spans
    receiver.stop()
    t_down = time.monotonic()
    time.sleep(args.outage)
    receiver = CountingReceiver(port)
    t_up = time.monotonic()
    proc.wait()
    reader.join()
    received += receiver.spans
    receiver.stop()
    return summarize(reports, t0, t_down, t_up, received, args)


def summarize(reports: list[dict[str, Any]], t0: float, t_down: float, t_up: float,
              received: int, args: argparse.Namespace) -> dict[str, Any]:
    def phase(start: float, end: float) -> dict[str, Any]:
        rows = [r for r in reports if start <= r["t"] <= end]
        if len(rows) < 2:
            return {}
        seconds = rows[-1]["t"] - rows[0]["t"]
        return {"cpu_%": round(100 * (rows[-1]["cpu"] - rows[0]["cpu"]) / seconds, 1),
                "rss_max_mib": round(max(r["rss"] for r in rows) / 2**20, 1),
                "waiting_max": max(r["held"] + r["spooled"] for r in rows),
                "spooled_max": max(r["spooled"] for r in rows)}

    drained = [r for r in reports if r["t"] > t_up and r["held"] + r["spooled"] == 0]
    drain_s = drained[0]["t"] - t_up if drained else None
    at_up = max((r["delivered"] for r in reports if r["t"] <= t_up), default=0)
    resumed = [r for r in reports if r["t"] > t_up and r["delivered"] > at_up]
    reconnect_s = resumed[0]["t"] - t_up if resumed else None
    backlog = max((r["held"] + r["spooled"] for r in reports if r["t"] <= t_up + 0.5),
                  default=0)
    last = reports[-1]
    return {
        "rate_spans_s": args.rate, "before": phase(t0, t_down),
        "outage": phase(t_down, t_up),
        "after": phase(t_up, t_up + (drain_s or args.after)),
        "backlog_spans": backlog, "drain_s": round(drain_s, 2) if drain_s else None,
        "first_delivery_after_s": round(reconnect_s, 2) if reconnect_s else None,
        "drain_spans_s": (round(backlog / (drain_s - reconnect_s))
                          if drain_s and reconnect_s and drain_s > reconnect_s else None),
        "ended": last["ended"], "delivered": last["delivered"], "received": received,
        "dropped": last["dropped"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=500, help="spans a second")
    parser.add_argument("--before", type=float, default=5, help="seconds before it")
    parser.add_argument("--outage", type=float, default=20, help="seconds the receiver is away")
    parser.add_argument("--after", type=float, default=30, help="seconds after it")
    parser.add_argument("--max-memory", type=int, default=64 * 2**20)
    parser.add_argument("--max-disk", type=int, default=2**30)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    parser.add_argument("--duration", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--spool", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    print(json.dumps(run(args), indent=1))


if __name__ == "__main__":
    main()

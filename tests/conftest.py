"""Shared fixtures: in-memory OTel providers, a real OTLP/gRPC receiver built from
``opentelemetry-proto``, and polling with a deadline."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent import futures
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.logs.v1 import (
    logs_service_pb2,
    logs_service_pb2_grpc,
)
from opentelemetry.proto.collector.metrics.v1 import (
    metrics_service_pb2,
    metrics_service_pb2_grpc,
)
from opentelemetry.proto.collector.trace.v1 import (
    trace_service_pb2,
    trace_service_pb2_grpc,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)

from dask_otel_spans.sdk.otlpjson import flatten_spans, to_otlp_json


def wait_for(predicate: Callable[[], Any], timeout: float = 20, interval: float = 0.05):
    """Poll ``predicate`` until it returns something truthy; fail at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


async def async_wait_for(predicate: Callable[[], Any], timeout: float = 20):
    import asyncio

    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(0.05)


class MemoryProviders:
    """SDK providers exporting to memory: ``spans()`` and ``points()``."""

    def __init__(self) -> None:
        self.span_exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.span_exporter))
        self.metric_reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.metric_reader])

    def spans(self) -> list:
        return list(self.span_exporter.get_finished_spans())

    def dask_spans(self) -> list:
        return [s for s in self.spans() if "dask.span.id" in (s.attributes or {})]

    def by_name(self, name: str) -> list:
        return [s for s in self.spans() if s.name == name]

    def points(self, name: str | None = None) -> list[tuple[str, dict, float]]:
        data = self.metric_reader.get_metrics_data()
        out = []
        if data is None:
            return out
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if name is not None and m.name != name:
                        continue
                    for dp in m.data.data_points:
                        value = getattr(dp, "value", None)
                        if value is None:
                            value = dp.sum
                        out.append((m.name, dict(dp.attributes), value))
        return out

    def shutdown(self) -> None:
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


@pytest.fixture
def memory() -> MemoryProviders:
    providers = MemoryProviders()
    yield providers
    providers.shutdown()


class OTLPReceiver:
    """An OTLP/gRPC collector stand-in: the official proto services, real wire format.

    ``required_headers``: metadata that every request must carry, else UNAUTHENTICATED.
    """

    def __init__(self, required_headers: dict[str, str] | None = None, port: int = 0,
                 delay: float = 0.0, credentials: Any = None):
        self.required_headers = required_headers or {}
        self.trace_requests: list[Any] = []
        self.metric_requests: list[Any] = []
        self.log_requests: list[Any] = []
        self.metadata: list[dict[str, str]] = []
        self.rejected = 0
        self.delay = delay
        self._lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        receiver = self

        class Traces(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request, context):
                time.sleep(receiver.delay)
                if not receiver._accept(context):
                    return trace_service_pb2.ExportTraceServiceResponse()
                with receiver._lock:
                    receiver.trace_requests.append(request)
                return trace_service_pb2.ExportTraceServiceResponse()

        class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
            def Export(self, request, context):
                if not receiver._accept(context):
                    return metrics_service_pb2.ExportMetricsServiceResponse()
                with receiver._lock:
                    receiver.metric_requests.append(request)
                return metrics_service_pb2.ExportMetricsServiceResponse()

        class Logs(logs_service_pb2_grpc.LogsServiceServicer):
            def Export(self, request, context):
                if not receiver._accept(context):
                    return logs_service_pb2.ExportLogsServiceResponse()
                with receiver._lock:
                    receiver.log_requests.append(request)
                return logs_service_pb2.ExportLogsServiceResponse()

        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), self.server)
        logs_service_pb2_grpc.add_LogsServiceServicer_to_server(Logs(), self.server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(
            Metrics(), self.server
        )
        if credentials is not None:
            self.port = self.server.add_secure_port(f"localhost:{port}", credentials)
            self.endpoint = f"https://localhost:{self.port}"
        else:
            self.port = self.server.add_insecure_port(f"127.0.0.1:{port}")
            self.endpoint = f"http://127.0.0.1:{self.port}"

    def _accept(self, context: Any) -> bool:
        metadata = {k: v for k, v in context.invocation_metadata()}
        with self._lock:
            self.metadata.append(metadata)
        for k, v in self.required_headers.items():
            if metadata.get(k) != v:
                with self._lock:
                    self.rejected += 1
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing api key")
                return False
        return True

    def start(self) -> OTLPReceiver:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop(grace=None)

    def spans(self) -> list[dict[str, Any]]:
        with self._lock:
            requests = list(self.trace_requests)
        return flatten_spans(to_otlp_json(r) for r in requests)

    def log_records(self) -> list[tuple[dict[str, Any], Any]]:
        """``(resource attributes, LogRecord)`` of every log record received."""
        with self._lock:
            requests = list(self.log_requests)
        out = []
        for req in requests:
            for rl in req.resource_logs:
                resource = {kv.key: kv.value.string_value
                            for kv in rl.resource.attributes}
                for sl in rl.scope_logs:
                    out += [(resource, record) for record in sl.log_records]
        return out

    def latest_sums(self, metric_name: str) -> dict[tuple, float]:
        """Latest cumulative value per attribute set of a sum metric."""
        with self._lock:
            requests = list(self.metric_requests)
        latest: dict[tuple, tuple[int, float]] = {}
        for req in requests:
            for rm in req.resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        if m.name != metric_name or not m.HasField("sum"):
                            continue
                        for dp in m.sum.data_points:
                            attrs = tuple(
                                sorted(
                                    (kv.key, kv.value.string_value)
                                    for kv in dp.attributes
                                )
                            )
                            value = (
                                dp.as_double
                                if dp.WhichOneof("value") == "as_double"
                                else dp.as_int
                            )
                            t = dp.time_unix_nano
                            if attrs not in latest or t >= latest[attrs][0]:
                                latest[attrs] = (t, value)
        return {k: v for k, (_, v) in latest.items()}


@pytest.fixture
def otlp_receiver() -> OTLPReceiver:
    receiver = OTLPReceiver().start()
    yield receiver
    receiver.stop()


@pytest.fixture(scope="module")
def module_otlp_receiver() -> OTLPReceiver:
    """One receiver for a module's shared cluster (its tests look at their own spans)."""
    receiver = OTLPReceiver().start()
    yield receiver
    receiver.stop()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class DaskProcesses:
    """``dask scheduler --preload dask_otel_spans`` and ``dask worker`` subprocesses
    (``worker_preload``: ``dask worker --preload dask_otel_spans``)."""

    def __init__(self, env: dict[str, str], cwd: str, workers: int = 1,
                 dashboard: bool = False, nanny: bool = False,
                 worker_preload: bool = False):
        self.port = free_port()
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.dashboard_port = free_port() if dashboard else None
        self.env = {
            **os.environ,
            "OTEL_METRIC_EXPORT_INTERVAL": "300",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            "DASK_OTEL_SPANS__EXPORT_DELAY": "0.2s",
            "PYTHONPATH": os.pathsep.join(sys.path),
            **env,
        }
        dash = (["--dashboard-address", f"127.0.0.1:{self.dashboard_port}"]
                if dashboard else ["--no-dashboard"])
        self.scheduler = subprocess.Popen(
            [sys.executable, "-m", "dask", "scheduler", "--host", "127.0.0.1",
             "--port", str(self.port), *dash, "--preload", "dask_otel_spans"],
            env=self.env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True,
        )
        self.workers = [
            subprocess.Popen(
                [sys.executable, "-m", "dask", "worker", self.address, "--nthreads",
                 "2", "--no-dashboard", "--nanny" if nanny else "--no-nanny",
                 *(["--preload", "dask_otel_spans"] if worker_preload else [])],
                env=self.env, cwd=cwd, stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
            )
            for _ in range(workers)
        ]

    def stop(self) -> str:
        """Stop everything (SIGTERM: a graceful scheduler close); the scheduler's log."""
        for p in [*self.workers, self.scheduler]:
            if p.poll() is None:
                p.terminate()
        for p in [*self.workers, self.scheduler]:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        return self.scheduler.stdout.read() if self.scheduler.stdout else ""


def otlp_grpc_env(receiver: OTLPReceiver) -> dict[str, str]:
    return {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_METRICS_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
    }


def wait_for_event(name: str) -> int:
    """A task that runs until the distributed ``Event`` ``name`` is set (a task that
    stays ``processing`` for as long as a test needs, and no longer)."""
    from distributed import Event

    Event(name).wait()
    return 1


def failing_providers():
    """A providers factory (``otel-spans.providers``) that fails when called."""
    raise RuntimeError("no collector credentials")


class Recorder:
    """Every handler of the protocol (``on_*``), recording its calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple]] = []

    def __getattr__(self, name: str):
        return lambda *args: self.calls.append((name, args))

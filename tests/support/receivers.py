"""An OTLP/gRPC collector stand-in built from ``opentelemetry-proto``: the official
services, the real wire format."""
from __future__ import annotations

import threading
import time
from concurrent import futures
from typing import Any

import grpc
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

from dask_otel_spans.sdk.otlpjson import flatten_spans, to_otlp_json

#: ``gen_cluster(clean_kwargs=...)`` of a test with a receiver in this process: its
#: server threads start with the first request, inside the cluster, and are not a
#: leak of the plugin's (tests without a receiver keep the thread-leak check)
RECEIVER_THREADS = {"threads": False}


class _Service:
    """One OTLP service's ``Export`` (traces, metrics or logs): check the headers,
    keep the request, answer with the service's empty response."""

    def __init__(self, receiver: OTLPReceiver, requests: list, response: type,
                 delayed: bool = False):
        self.receiver = receiver
        self.requests = requests
        self.response = response
        self.delayed = delayed

    def Export(self, request, context):  # noqa: N802 (the service's method name)
        if self.delayed:
            time.sleep(self.receiver.delay)
        if self.receiver._accept(context):
            with self.receiver._lock:
                self.requests.append(request)
        return self.response()


class OTLPReceiver:
    """An OTLP/gRPC collector stand-in: the official proto services, real wire format.

    ``required_headers``: metadata that every request must carry, else UNAUTHENTICATED.
    ``delay``: seconds each trace export waits before its answer.
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
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(
            _Service(self, self.trace_requests,
                     trace_service_pb2.ExportTraceServiceResponse, delayed=True),
            self.server,
        )
        logs_service_pb2_grpc.add_LogsServiceServicer_to_server(
            _Service(self, self.log_requests,
                     logs_service_pb2.ExportLogsServiceResponse),
            self.server,
        )
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(
            _Service(self, self.metric_requests,
                     metrics_service_pb2.ExportMetricsServiceResponse),
            self.server,
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

"""An OTLP/gRPC collector stand-in built from ``opentelemetry-proto``: the official
services, the real wire format."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
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
                 delayed: bool = False, refuse: Callable[[], bool] | None = None):
        self.receiver = receiver
        self.requests = requests
        self.response = response
        self.delayed = delayed
        self.refuse = refuse

    def Export(self, request, context):
        if self.delayed and self.receiver._late():
            # (taken, then answered past a shorter deadline: the exporter sees none)
            with self.receiver._lock:
                self.requests.append(request)
            time.sleep(self.receiver.delay)
            return self.response()
        if self.delayed and not self.receiver.answers_late:
            time.sleep(self.receiver.delay)
        if self.refuse is not None and self.refuse():
            context.set_trailing_metadata(self.receiver.retry_metadata)
            context.abort(grpc.StatusCode.UNAVAILABLE, "busy: retry later")
        if self.receiver._accept(context):
            with self.receiver._lock:
                self.requests.append(request)
        return self.response()


class OTLPReceiver:
    """An OTLP/gRPC collector stand-in: the official proto services, real wire format.

    ``required_headers``: metadata that every request must carry, else UNAUTHENTICATED.
    ``delay``: seconds each trace export waits before its answer.
    ``unavailable``: trace exports answered UNAVAILABLE first, with a ``RetryInfo``
    of ``retry_delay`` seconds (when given); ``attempts`` holds the monotonic time of
    every trace export. ``unavailable_metrics``: the same for metric exports
    (``metric_attempts``). ``late``: the first ``late`` trace exports are kept at
    once and answered after ``delay`` seconds (the others at once).
    """

    def __init__(self, required_headers: dict[str, str] | None = None, port: int = 0,
                 delay: float = 0.0, credentials: Any = None, unavailable: int = 0,
                 retry_delay: float | None = None, unavailable_metrics: int = 0,
                 late: int = 0):
        self.required_headers = required_headers or {}
        self.late = late
        #: the first exports are late, the others answered at once
        self.answers_late = late > 0
        self.unavailable = unavailable
        self.unavailable_metrics = unavailable_metrics
        self.metric_attempts: list[float] = []
        self.attempts: list[float] = []
        self.retry_metadata: tuple = ()
        if retry_delay is not None:
            from google.protobuf.duration_pb2 import Duration
            from google.rpc.error_details_pb2 import RetryInfo

            seconds = int(retry_delay)
            info = RetryInfo(retry_delay=Duration(
                seconds=seconds, nanos=int((retry_delay - seconds) * 1e9)))
            self.retry_metadata = (("google.rpc.retryinfo-bin", info.SerializeToString()),)
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
                     trace_service_pb2.ExportTraceServiceResponse, delayed=True,
                     refuse=self._refuse),
            self.server,
        )
        logs_service_pb2_grpc.add_LogsServiceServicer_to_server(
            _Service(self, self.log_requests,
                     logs_service_pb2.ExportLogsServiceResponse),
            self.server,
        )
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(
            _Service(self, self.metric_requests,
                     metrics_service_pb2.ExportMetricsServiceResponse,
                     refuse=self._refuse_metrics),
            self.server,
        )
        if credentials is not None:
            self.port = self.server.add_secure_port(f"localhost:{port}", credentials)
            self.endpoint = f"https://localhost:{self.port}"
        else:
            self.port = self.server.add_insecure_port(f"127.0.0.1:{port}")
            self.endpoint = f"http://127.0.0.1:{self.port}"

    def _refuse(self) -> bool:
        """Count a trace export; whether it is one of the first ``unavailable``."""
        with self._lock:
            self.attempts.append(time.monotonic())
            if self.unavailable > 0:
                self.unavailable -= 1
                return True
        return False

    def _late(self) -> bool:
        """Count a trace export; whether it is one of the first ``late``."""
        with self._lock:
            if self.late <= 0:
                return False
            self.late -= 1
            self.attempts.append(time.monotonic())
            return True

    def _refuse_metrics(self) -> bool:
        with self._lock:
            self.metric_attempts.append(time.monotonic())
            refuse = self.unavailable_metrics > 0
            self.unavailable_metrics -= refuse
        return refuse

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


class OTLPHttpReceiver:
    """An OTLP/HTTP (``http/protobuf``) receiver: POST ``/v1/traces``, ``/v1/metrics``,
    ``/v1/logs``; the first ``unavailable`` trace requests are answered 503 with
    ``Retry-After: retry_after`` (when given); ``attempts``: the monotonic time of
    every trace request; ``unavailable_metrics``, ``metric_attempts``: the same for
    metric requests. ``late``: the first ``late`` trace requests are kept at once and
    answered after ``delay`` seconds. ``port``: 0 for a free one (:meth:`start` again
    on the same port after :meth:`stop`)."""

    def __init__(self, port: int = 0, unavailable: int = 0,
                 retry_after: float | None = None, unavailable_metrics: int = 0,
                 late: int = 0, delay: float = 0.0):
        self.late = late
        self.delay = delay
        self.unavailable_metrics = unavailable_metrics
        self.metric_attempts: list[float] = []
        self.trace_requests: list[Any] = []
        self.log_requests: list[Any] = []
        self.metric_requests: list[Any] = []
        self.attempts: list[float] = []
        #: the headers of every request, whatever its path (names in lower case)
        self.headers: list[dict[str, str]] = []
        self.unavailable = unavailable
        self.retry_after = retry_after
        self.port = port
        self._lock = threading.Lock()
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> OTLPHttpReceiver:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        receiver = self
        kinds = {
            "/v1/traces": (self.trace_requests, trace_service_pb2.ExportTraceServiceRequest,
                           trace_service_pb2.ExportTraceServiceResponse),
            "/v1/logs": (self.log_requests, logs_service_pb2.ExportLogsServiceRequest,
                         logs_service_pb2.ExportLogsServiceResponse),
            "/v1/metrics": (self.metric_requests,
                            metrics_service_pb2.ExportMetricsServiceRequest,
                            metrics_service_pb2.ExportMetricsServiceResponse),
        }

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with receiver._lock:
                    receiver.headers.append({k.lower(): v for k, v in self.headers.items()})
                if self.path not in kinds:
                    self.send_response(404)
                    self.end_headers()
                    return
                requests, request, response = kinds[self.path]
                refuse, late = receiver._answer(self.path)
                if not refuse:
                    with receiver._lock:
                        requests.append(request.FromString(body))
                if late:  # (taken, then answered past a shorter timeout)
                    time.sleep(receiver.delay)
                if refuse:
                    self.send_response(503)
                    if receiver.retry_after is not None:
                        self.send_header("Retry-After", f"{receiver.retry_after:g}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data = response().SerializeToString()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/x-protobuf")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # (a late answer: the client gave up waiting)

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self._server.server_port
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def _answer(self, path: str) -> tuple[bool, bool]:
        """Count a request to ``path``: whether it is refused (503), and whether it
        is answered late."""
        with self._lock:
            if path == "/v1/traces":
                self.attempts.append(time.monotonic())
                refuse = self.unavailable > 0
                self.unavailable -= refuse
                late = not refuse and self.late > 0
                self.late -= late
                return refuse, late
            if path == "/v1/metrics":
                self.metric_attempts.append(time.monotonic())
                refuse = self.unavailable_metrics > 0
                self.unavailable_metrics -= refuse
                return refuse, False
        return False, False

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join()
            self._server = None

    def spans(self) -> list[dict[str, Any]]:
        with self._lock:
            requests = list(self.trace_requests)
        return flatten_spans(to_otlp_json(r) for r in requests)

    def log_records(self) -> list[Any]:
        with self._lock:
            requests = list(self.log_requests)
        return [record for req in requests for rl in req.resource_logs
                for sl in rl.scope_logs for record in sl.log_records]


class AnsweringHTTPServer:
    """An HTTP server that answers every request, whatever its method, with
    ``status`` and ``headers`` (a redirect to another server, say), and keeps what it
    got: ``requests``, each ``(method, path, headers, body)`` (header names in lower
    case)."""

    def __init__(self, status: int, headers: dict[str, str] | None = None):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        server = self
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []

        class Handler(BaseHTTPRequestHandler):
            def answer(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                server.requests.append((self.command, self.path, {
                    k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(status)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                if status >= 200 and status not in (204, 304):
                    self.send_header("Content-Length", "0")
                self.end_headers()

            do_POST = do_GET = do_PUT = answer

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_port}"
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> AnsweringHTTPServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

"""OTLP over gRPC and http/protobuf, configured only through OTEL_* variables, against
receivers decoding the real wire format; configured headers reach the receiver."""
from __future__ import annotations

import gzip
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from conftest import OTLPReceiver, async_wait_for
from distributed.utils_test import gen_cluster, inc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from dask_otel_spans import OTelSpansPlugin, names, span
from dask_otel_spans.sdk.otlpjson import flatten_spans, to_otlp_json

#: The receivers run in this process: their server threads start with the first
#: request, inside the cluster, and are not a leak of the plugin's (test_plugin.py
#: keeps gen_cluster's thread-leak check for the plugin itself).
RECEIVER_THREADS = {"threads": False}


class HTTPReceiver:
    """OTLP/HTTP receiver: POST /v1/traces and /v1/metrics, protobuf bodies."""

    def __init__(self):
        self.traces: list = []
        self.metrics: list = []
        self.headers: list[dict[str, str]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                receiver.headers.append({k.lower(): v for k, v in self.headers.items()})
                if self.path == "/v1/traces":
                    receiver.traces.append(
                        trace_service_pb2.ExportTraceServiceRequest.FromString(body))
                    reply = trace_service_pb2.ExportTraceServiceResponse()
                elif self.path == "/v1/metrics":
                    receiver.metrics.append(
                        metrics_service_pb2.ExportMetricsServiceRequest.FromString(body))
                    reply = metrics_service_pb2.ExportMetricsServiceResponse()
                else:
                    self.send_response(404)
                    self.end_headers()
                    return
                data = reply.SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def spans(self):
        return flatten_spans(to_otlp_json(r) for r in list(self.traces))

    def stop(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def http_receiver():
    r = HTTPReceiver()
    yield r
    r.stop()


def env_plugin(environ, **settings) -> OTelSpansPlugin:
    return OTelSpansPlugin(
        environ=environ, use_global_providers=False,
        export_delay=0.1, idle_timeout=1.0, **settings,
    )


def test_http_protobuf_with_headers_and_gzip(http_receiver):
    environ = {
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_ENDPOINT": http_receiver.endpoint,
        "OTEL_EXPORTER_OTLP_HEADERS": "api-key=s3cr3t,x-tenant=data%20team",
        "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    }

    @gen_cluster(client=True, clean_kwargs=RECEIVER_THREADS)
    async def run(c, s, a, b):
        plugin = env_plugin(environ)
        await c.register_plugin(plugin)
        with span("over http"):
            await c.submit(inc, 1, key="inc-1")
        await async_wait_for(lambda: any(sp["name"] == "over http" for sp in http_receiver.spans()))
        await plugin.close()  # flushes the metrics too
        assert http_receiver.metrics

    run()
    assert http_receiver.headers[0]["api-key"] == "s3cr3t"
    assert http_receiver.headers[0]["x-tenant"] == "data team"
    assert http_receiver.headers[0]["content-encoding"] == "gzip"
    [sp] = [sp for sp in http_receiver.spans() if sp["name"] == "over http"]
    assert sp["attributes"][names.SPAN_TASK_COUNT] == 1


def test_grpc_receiver_requiring_an_api_key_gets_it():
    receiver = OTLPReceiver(required_headers={"api-key": "s3cr3t"}).start()
    environ = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
        "OTEL_EXPORTER_OTLP_HEADERS": "api-key=s3cr3t",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    }
    try:
        @gen_cluster(client=True, clean_kwargs=RECEIVER_THREADS)
        async def run(c, s, a, b):
            plugin = env_plugin(environ)
            await c.register_plugin(plugin)
            with span("authenticated"):
                await c.submit(inc, 1, key="inc-1")
            await async_wait_for(lambda: any(sp["name"] == "authenticated" for sp in receiver.spans()))
            await plugin.close()

        run()
        assert receiver.rejected == 0
        assert all(m["api-key"] == "s3cr3t" for m in receiver.metadata)
        assert receiver.metric_requests
    finally:
        receiver.stop()


def test_grpc_receiver_rejects_a_missing_api_key():
    receiver = OTLPReceiver(required_headers={"api-key": "s3cr3t"}).start()
    environ = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "2",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    }
    try:
        @gen_cluster(client=True, clean_kwargs=RECEIVER_THREADS)
        async def run(c, s, a, b):
            plugin = env_plugin(environ)
            await c.register_plugin(plugin)
            with span("anonymous"):
                assert await c.submit(inc, 1, key="inc-1") == 2
            await async_wait_for(lambda: receiver.rejected > 0)
            await plugin.close()

        run()
        assert receiver.spans() == []
    finally:
        receiver.stop()

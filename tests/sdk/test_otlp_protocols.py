"""OTLP over gRPC and http/protobuf, configured only through OTEL_* variables, against
receivers decoding the real wire format; configured headers reach the receiver."""
from __future__ import annotations

import gzip
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from distributed.utils_test import gen_cluster, inc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from support.plugin import FAST
from support.polling import async_wait_for
from support.receivers import RECEIVER_THREADS, OTLPReceiver

from dask_otel_spans import OTelSpansPlugin, names, span
from dask_otel_spans.sdk.otlpjson import flatten_spans, to_otlp_json


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
    return OTelSpansPlugin(environ=environ, use_global_providers=False,
                           **{**FAST, **settings})


@pytest.fixture
def http_environ(http_receiver) -> dict[str, str]:
    """OTLP http/protobuf to ``http_receiver``, with headers and gzip."""
    return {
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_ENDPOINT": http_receiver.endpoint,
        "OTEL_EXPORTER_OTLP_HEADERS": "api-key=s3cr3t,x-tenant=data%20team",
        "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    }


@gen_cluster(client=True, clean_kwargs=RECEIVER_THREADS)
async def test_http_protobuf_with_headers_and_gzip(c, s, a, b, http_receiver,
                                                   http_environ):
    plugin = env_plugin(http_environ)
    await c.register_plugin(plugin)
    with span("over http"):
        await c.submit(inc, 1, key="inc-1")
    await async_wait_for(lambda: any(sp["name"] == "over http" for sp in http_receiver.spans()))
    await plugin.close()  # flushes the metrics too
    assert http_receiver.metrics
    assert http_receiver.headers[0]["api-key"] == "s3cr3t"
    assert http_receiver.headers[0]["x-tenant"] == "data team"
    assert http_receiver.headers[0]["content-encoding"] == "gzip"
    [sp] = [sp for sp in http_receiver.spans() if sp["name"] == "over http"]
    assert sp["attributes"][names.SPAN_TASK_COUNT] == 1


@pytest.fixture
def keyed_receiver() -> OTLPReceiver:
    """A gRPC receiver that turns away a request without the header api-key=s3cr3t."""
    receiver = OTLPReceiver(required_headers={"api-key": "s3cr3t"}).start()
    yield receiver
    receiver.stop()


@gen_cluster(client=True, clean_kwargs=RECEIVER_THREADS)
async def test_grpc_receiver_requiring_an_api_key_gets_it(c, s, a, b, keyed_receiver):
    plugin = env_plugin({
        "OTEL_EXPORTER_OTLP_ENDPOINT": keyed_receiver.endpoint,
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
        "OTEL_EXPORTER_OTLP_HEADERS": "api-key=s3cr3t",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    })
    await c.register_plugin(plugin)
    with span("authenticated"):
        await c.submit(inc, 1, key="inc-1")
    await async_wait_for(
        lambda: any(sp["name"] == "authenticated" for sp in keyed_receiver.spans()))
    await plugin.close()
    assert keyed_receiver.rejected == 0
    assert all(m["api-key"] == "s3cr3t" for m in keyed_receiver.metadata)
    assert keyed_receiver.metric_requests


@gen_cluster(client=True, clean_kwargs=RECEIVER_THREADS)
async def test_grpc_receiver_rejects_a_missing_api_key(c, s, a, b, keyed_receiver):
    plugin = env_plugin({
        "OTEL_EXPORTER_OTLP_ENDPOINT": keyed_receiver.endpoint,
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "2",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    })
    await c.register_plugin(plugin)
    with span("anonymous"):
        assert await c.submit(inc, 1, key="inc-1") == 2
    await async_wait_for(lambda: keyed_receiver.rejected > 0)
    await plugin.close()
    assert keyed_receiver.spans() == []

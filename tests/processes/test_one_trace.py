"""Real processes: ``dask scheduler --preload dask_otel_spans`` and ``dask worker
--preload dask_otel_spans`` exporting over OTLP/gRPC to a receiver built from
``opentelemetry-proto``, with the client's own span exported there too: a span a task
opens (``worker_client``, plain ``distributed.span``) and the work it computes are in
the client's trace, every parent a span of it. (Each other case on ``gen_cluster``:
``scheduler/test_one_trace.py``; in Jaeger: ``test_jaeger.py``.)"""
from __future__ import annotations

from collections.abc import Iterator

import pytest
from distributed import Client
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from support.jaeger import inner_span_through_worker_client
from support.polling import wait_for
from support.processes import DaskProcesses, otlp_grpc_env
from support.receivers import OTLPReceiver

from dask_otel_spans import names, span
from dask_otel_spans.protocol.propagation import otel_span_id, prefix_span_id

N = 4


@pytest.fixture
def cluster(otlp_receiver: OTLPReceiver, tmp_path) -> Iterator[str]:
    # (the inner span is a plain one: handed over once idle for a second)
    procs = DaskProcesses({**otlp_grpc_env(otlp_receiver),
                           "DASK_OTEL_SPANS__IDLE_TIMEOUT": "1s"},
                          cwd=str(tmp_path), worker_preload=True)
    try:
        yield procs.address
    finally:
        procs.stop()


@pytest.fixture
def client_provider(otlp_receiver: OTLPReceiver) -> Iterator[TracerProvider]:
    """The client application's provider, exporting its spans to the receiver."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(
        OTLPSpanExporter(endpoint=otlp_receiver.endpoint, insecure=True)))
    yield provider
    provider.shutdown()


def test_a_span_a_task_opens_and_its_work_are_in_the_clients_trace(
        cluster, otlp_receiver, client_provider):
    with Client(cluster, timeout=60) as client:
        client.wait_for_workers(1, timeout=60)
        tracer = client_provider.get_tracer("client app")
        with tracer.start_as_current_span("request") as request:
            with span("outer") as outer_id:
                assert client.submit(inner_span_through_worker_client, N).result() == (
                    N * (N - 1) // 2)

    def complete():
        spans = otlp_receiver.spans()
        counts = {n: sum(s["name"] == n for s in spans)
                  for n in ("request", "outer", "inner", "in task")}
        return spans if counts == {"request": 1, "outer": 1, "inner": 1,
                                   "in task": N} else None

    spans = wait_for(complete, timeout=40)
    by_id = {s["spanId"]: s for s in spans}
    assert {s["traceId"] for s in spans} == {
        f"{request.get_span_context().trace_id:032x}"}
    assert [s["name"] for s in spans if s.get("parentSpanId")
            and s["parentSpanId"] not in by_id] == []
    (inner,) = [s for s in spans if s["name"] == "inner"]
    inner_id = inner["attributes"][names.SPAN_ID]
    assert inner["parentSpanId"] == f"{otel_span_id(outer_id):016x}"
    inner_prefix = f"{prefix_span_id(inner_id, 'traced_task'):016x}"
    assert by_id[inner_prefix]["parentSpanId"] == inner["spanId"]
    assert {s["parentSpanId"] for s in spans if s["name"] == "in task"} == {inner_prefix}
    assert {s["resource"]["service.name"] for s in spans if s["name"] == "in task"} == {
        names.DEFAULT_WORKER_SERVICE_NAME}

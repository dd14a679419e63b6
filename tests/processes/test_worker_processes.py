"""Real processes: ``dask scheduler`` and ``dask worker``, each with ``--preload
dask_otel_spans``, exporting traces, metrics and logs over OTLP/gRPC to a receiver
built from ``opentelemetry-proto``: task code joins the dask span's trace."""
from __future__ import annotations

import http.server
import logging
import subprocess
import sys
import threading
import urllib.request

import dask
import pytest
from distributed import Client
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, use_span
from support.polling import wait_for
from support.processes import DaskProcesses, otlp_grpc_env

from dask_otel_spans import names, span
from dask_otel_spans.protocol.propagation import otel_span_id, prefix_span_id
from dask_otel_spans.sdk.otlpjson import read_spans


class Quiet(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


@pytest.fixture
def http_url():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/data"
    server.shutdown()


@pytest.fixture(scope="module")
def otlp_receiver(module_otlp_receiver):
    return module_otlp_receiver


@pytest.fixture(scope="module")
def cluster(otlp_receiver, tmp_path_factory):
    """A scheduler and a worker under a nanny, both preloaded (started once for the
    module: each test names its own spans)."""
    procs = DaskProcesses(
        {**otlp_grpc_env(otlp_receiver), "OTEL_LOGS_EXPORTER": "otlp",
         "OTEL_SERVICE_NAME": ""},
        cwd=str(tmp_path_factory.mktemp("cluster")), nanny=True, worker_preload=True,
    )
    try:
        yield procs.address
    finally:
        procs.stop()


def fetch(url: str) -> int:
    """Task code: its own span, an HTTP call through opentelemetry-instrumentation-
    urllib, and a warning."""
    from opentelemetry import trace
    from opentelemetry.instrumentation.urllib import URLLibInstrumentor

    if not URLLibInstrumentor().is_instrumented_by_opentelemetry:
        URLLibInstrumentor().instrument()
    with trace.get_tracer("task code").start_as_current_span("parse input"):
        with urllib.request.urlopen(url, timeout=10) as response:
            status = response.status
        logging.getLogger("task code").warning("fetched %s", url)
    return status


def test_task_code_joins_the_dask_span_trace_from_real_workers(
        cluster, otlp_receiver, http_url):
    client_tracer = TracerProvider().get_tracer("client-app")
    with Client(cluster, timeout=60) as client:
        client.wait_for_workers(1, timeout=60)
        with client_tracer.start_as_current_span("client request") as request:
            with span("etl") as etl_id:
                assert client.submit(fetch, http_url, key="fetch-1").result() == 200
        trace_hex = f"{request.get_span_context().trace_id:032x}"
        prefix_hex = f"{prefix_span_id(etl_id, 'fetch'):016x}"

        def exported():
            spans = {s["name"]: s for s in otlp_receiver.spans()}
            wanted = {"etl", "fetch", "parse input", "GET"}
            return spans if wanted <= set(spans) else None

        spans = wait_for(exported, timeout=30)
        etl, prefix, own, http = (spans[n] for n in ("etl", "fetch", "parse input",
                                                     "GET"))
        assert {etl["traceId"], prefix["traceId"], own["traceId"], http["traceId"]} == {
            trace_hex}
        assert etl["parentSpanId"] == f"{request.get_span_context().span_id:016x}"
        assert etl["spanId"] == f"{otel_span_id(etl_id):016x}"
        assert prefix["spanId"] == prefix_hex and prefix["parentSpanId"] == etl["spanId"]
        assert own["parentSpanId"] == prefix_hex
        assert http["parentSpanId"] == own["spanId"]
        worker = next(iter(client.scheduler_info()["workers"].values()))
        assert own["resource"]["service.name"] == "dask-worker"
        assert own["resource"][names.WORKER_ADDRESS] == worker["id"]
        assert own["resource"][names.WORKER_NAME] == str(worker["name"])

        def warning():
            found = [(res, r) for res, r in otlp_receiver.log_records()
                     if r.body.string_value.startswith("fetched ")]
            return found or None

        ((resource, record),) = wait_for(warning, timeout=30)
        assert record.trace_id.hex() == trace_hex
        assert record.span_id.hex() == own["spanId"]
        assert resource["service.name"] == "dask-worker"


def test_tasks_after_a_nanny_restart_and_after_export_keep_their_context(cluster):
    def ids() -> tuple[str, str, bool]:
        from opentelemetry import trace

        ctx = trace.get_current_span().get_span_context()
        return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}", ctx.trace_flags.sampled

    with Client(cluster, timeout=60) as client:
        client.wait_for_workers(1, timeout=60)
        unsampled = NonRecordingSpan(SpanContext(
            0x1234, 0x5678, is_remote=False, trace_flags=TraceFlags(0)))
        with use_span(unsampled):
            with span("before restart") as first_id:
                first = client.submit(ids, key="ids-1").result()
        assert first == (f"{0x1234:032x}", f"{prefix_span_id(first_id, 'ids'):016x}",
                         False)
        client.restart()  # (the nanny starts a new worker process, preloaded again)
        client.wait_for_workers(1, timeout=60)
        with span("after restart") as second_id:
            future = client.submit(ids, key="ids-2")
            assert future.result()[1] == f"{prefix_span_id(second_id, 'ids'):016x}"
        # a task of that span after the span was exported (its block closed and
        # the export delay passed): still in the span's context
        wait_for(lambda: client.run_on_scheduler(_open_spans) == 0, timeout=30)
        with dask.annotate(span={"name": ("after restart",), "ids": (second_id,)}):
            late = client.submit(ids, key="ids-3")
        assert late.result()[1] == f"{prefix_span_id(second_id, 'ids'):016x}"


def _open_spans(dask_scheduler) -> int:
    return dask_scheduler.plugins[names.PLUGIN_NAME].open_span_count


def test_with_nothing_configured_each_worker_process_writes_files_of_its_own(
        tmp_path):
    """The embedded default on a worker: OTLP-JSON lines files in a directory of the
    process's own below the output directory, with the worker's resource."""
    script = (
        "import os, sys\n"
        "from opentelemetry import trace\n"
        "from dask_otel_spans.worker.providers import worker_providers\n"
        "p = worker_providers('tcp://10.0.0.7:4000', 'w-1', environ={},\n"
        "                     output_dir=sys.argv[1])\n"
        "with trace.get_tracer('task code').start_as_current_span('in a task'):\n"
        "    pass\n"
        "p.tracer_provider.force_flush()\n"
        "print(os.getpid())\n"
    )
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path)],
                         capture_output=True, text=True, timeout=60, check=True)
    pid = out.stdout.strip()
    traces = tmp_path / "workers" / f"w-1-{pid}" / "traces.jsonl"
    (own,) = read_spans(str(traces))
    assert own["name"] == "in a task"
    assert own["resource"]["service.name"] == "dask-worker"
    assert own["resource"][names.WORKER_ADDRESS] == "tcp://10.0.0.7:4000"

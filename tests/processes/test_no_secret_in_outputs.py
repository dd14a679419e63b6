"""A real scheduler and worker (both ``--preload dask_otel_spans``) exporting over
OTLP/HTTP to an endpoint URL with a password, with an API key header, while the
collector is down; closed; then ``dask-otel-spans resend`` once it is up. No output of
the package (every process's log, ``ExportState``, ``outcome()``, ``resend``'s output)
holds the header value or the password, though each says the destination; what
arrives carries both, as credentials."""
from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path

import pytest
from distributed import Client
from support.polling import wait_for
from support.processes import DaskProcesses, free_port
from support.receivers import OTLPHttpReceiver

from dask_otel_spans import span
from dask_otel_spans.state import scheduler_state

API_KEY = "hdr-SECRET-4a7f19"
PASSWORD = "pw-SECRET-b2c8e5"


def spans_made_in_a_task(n: int) -> int:
    from opentelemetry import trace

    with trace.get_tracer("test").start_as_current_span("made in a task"):
        return n


def held(state) -> int:
    return state.held.get("traces", 0) + state.spooled.get("traces", 0)


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """Every output of a run whose collector is down, then up for ``resend``: name
    -> text; and the receiver that got what ``resend`` sent."""
    root = tmp_path_factory.mktemp("secrets")
    spool, logs = root / "spool", root / "logs"
    logs.mkdir()
    port = free_port()  # (the collector: down until resend)
    env = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_METRICS_EXPORTER": "otlp",
           "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
           "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://ann:{PASSWORD}@127.0.0.1:{port}",
           "OTEL_EXPORTER_OTLP_HEADERS": f"api-key={API_KEY}",
           "OTEL_EXPORTER_OTLP_TIMEOUT": "0.5",
           "DASK_OTEL_SPANS__SPOOL__DIRECTORY": str(spool),
           # (at close, the collector being down: what is held goes to the spool)
           "DASK_OTEL_SPANS__SHUTDOWN_TIMEOUT": "0.5s"}
    out: dict[str, str] = {}
    procs = DaskProcesses(env, cwd=str(root), worker_preload=True, worker_logs=str(logs))
    try:
        with Client(procs.address, timeout=60) as client:
            client.wait_for_workers(1, timeout=60)
            with span("while the collector is down"):
                client.gather(client.map(spans_made_in_a_task, range(3)))
            state = wait_for(lambda: held(s := client.run_on_scheduler(scheduler_state))
                             and s, timeout=60)
            out["ExportState"] = repr(state)
            out["outcome()"] = state.outcome()
    finally:
        out["scheduler log"] = procs.stop()
    for log in sorted(logs.iterdir()):
        out[log.name] = log.read_text()
    receiver = OTLPHttpReceiver(port=port).start()
    try:
        resent = subprocess.run(
            [str(Path(sys.executable).parent / "dask-otel-spans"), "resend", str(spool),
             "--timeout", "20"],
            env={**os.environ, **env}, capture_output=True, text=True, timeout=60)
        out["resend stdout"], out["resend stderr"] = resent.stdout, resent.stderr
    finally:
        receiver.stop()
    return out, receiver


def test_no_output_holds_the_header_value_or_the_password(outputs):
    out, _ = outputs
    for name, text in out.items():
        assert API_KEY not in text, name
        assert PASSWORD not in text, name


@pytest.mark.parametrize("output, said", [
    ("scheduler log", "dask_otel_spans: traces to OTLP http/protobuf to http://ann:***@"),
    ("scheduler log", "cannot export spans to OTLP http/protobuf to http://ann:***@"),
    ("scheduler log", "at close, traces to OTLP http/protobuf to http://ann:***@"),
    ("worker-0.log", "http://ann:***@127.0.0.1:"),
    ("ExportState", "http://ann:***@127.0.0.1:"),
    ("outcome()", "traces to OTLP http/protobuf to http://ann:***@127.0.0.1:"),
    ("resend stdout", "traces to OTLP http/protobuf to http://ann:***@127.0.0.1:"),
])
def test_each_output_says_the_destination_masked(outputs, output, said):
    out, _ = outputs
    assert said in out[output], out[output]


def test_what_resend_delivers_carries_the_password_and_the_key_as_credentials(outputs):
    _, receiver = outputs
    assert any(s["name"] == "while the collector is down" for s in receiver.spans())
    basic = "Basic " + base64.b64encode(f"ann:{PASSWORD}".encode()).decode()
    assert receiver.headers
    assert all(h.get("authorization") == basic and h.get("api-key") == API_KEY
               for h in receiver.headers)


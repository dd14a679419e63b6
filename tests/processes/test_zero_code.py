"""Zero-code, under the real launcher: ``opentelemetry-instrument dask scheduler`` and
``opentelemetry-instrument dask worker ADDR`` (under a nanny), with no ``--preload``,
load the package's plugins, once each; a client's plain ``distributed.span`` under
instrumentation is exported as the child of the client's span, and task code runs in
its trace; a bare submission's task code runs in its caller's trace, with its
baggage, and the default span links to the caller; ``TRACEPARENT`` parents a
script's spans. ``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=dask`` turns it off."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import distributed
import pytest
from distributed import Client
from opentelemetry import baggage
from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.util._importlib_metadata import entry_points
from support.polling import wait_for
from support.processes import DaskProcesses, opentelemetry_instrument, otlp_grpc_env

from dask_otel_spans import names, wait_for_export
from dask_otel_spans.instrumentation import DaskInstrumentor
from dask_otel_spans.protocol.propagation import otel_span_id
from dask_otel_spans.sdk.otlpjson import read_spans


@pytest.fixture(autouse=True, scope="module")
def registered():
    """The launcher finds instrumentors by their installed entry points: the package
    must be installed from this tree (``pip install -e '.[test]'``)."""
    found = [ep.value for ep in entry_points(group="opentelemetry_instrumentor",
                                               name="dask")]
    assert found == ["dask_otel_spans.instrumentation:DaskInstrumentor"], (
        "the opentelemetry_instrumentor entry point 'dask' is not installed: "
        "pip install -e '.[test]'")


def plugins_of(dask_scheduler=None, dask_worker=None) -> list[str]:
    """The names of the package's plugins on a server (run there)."""
    server = dask_scheduler or dask_worker
    from dask_otel_spans import OTelSpansPlugin, OTelWorkerPlugin

    return sorted(name for name, p in server.plugins.items()
                  if isinstance(p, (OTelSpansPlugin, OTelWorkerPlugin)))


def traced_task(name: str = "in task") -> tuple[str, dict]:
    """Task code: a span of its own, with the global tracer (the launcher's); its
    trace id and the baggage it sees."""
    from opentelemetry import baggage, trace

    with trace.get_tracer("task code").start_as_current_span(name) as own:
        return f"{own.get_span_context().trace_id:032x}", dict(baggage.get_all())


def export_process_of(dask_scheduler) -> bool:
    """run_on_scheduler: whether the plugin exports from an export process."""
    return dask_scheduler.plugins[names.PLUGIN_NAME].destinations["export_process"]


def hex_ids(span) -> tuple[str, str]:
    sc = span.get_span_context()
    return f"{sc.trace_id:032x}", f"{sc.span_id:016x}"


@pytest.fixture(scope="module")
def launched(module_otlp_receiver, tmp_path_factory):
    """A scheduler and a nanny worker under ``opentelemetry-instrument``, no
    ``--preload``, exporting to the module's receiver; the scheduler's log is
    checked when they stop."""
    procs = DaskProcesses(
        {**otlp_grpc_env(module_otlp_receiver), "OTEL_LOGS_EXPORTER": "none",
         "OTEL_SERVICE_NAME": "zero-code", "DASK_OTEL_SPANS__IDLE_TIMEOUT": "1s"},
        cwd=str(tmp_path_factory.mktemp("zero-code")), nanny=True,
        scheduler_preload=False, launcher=(opentelemetry_instrument(),),
    )
    try:
        yield procs
    finally:
        log = procs.stop()
    assert "Failed to start preload" not in log, log
    assert "already contains a plugin" not in log, log


@pytest.fixture
def client(launched):
    with Client(launched.address, timeout=60) as client:
        client.wait_for_workers(1, timeout=60)
        yield client


@pytest.fixture
def instrumented():
    """This client process instrumented as the launcher would."""
    instrumentor = DaskInstrumentor()
    instrumentor.instrument()
    yield instrumentor
    instrumentor.uninstrument()


def spans_named(receiver, *wanted: str) -> dict[str, dict]:
    """The receiver's spans by name, once each of ``wanted`` came."""
    def exported():
        spans = {s["name"]: s for s in receiver.spans()}
        return spans if set(wanted) <= set(spans) else None

    return wait_for(exported, timeout=30)


def test_the_launcher_loads_both_plugins_without_a_preload(client):
    assert client.run_on_scheduler(plugins_of) == [names.PLUGIN_NAME]
    # the launcher's global providers come from OTEL_*: the plugin exports from
    # its export process, built from the same variables
    assert client.run_on_scheduler(export_process_of) is True
    assert list(client.run(plugins_of).values()) == [[names.WORKER_PLUGIN_NAME]]


def test_a_plain_distributed_span_is_the_child_of_the_clients_span(
        client, instrumented, module_otlp_receiver):
    tracer = TracerProvider().get_tracer("client-app")
    with tracer.start_as_current_span("client request") as request:
        with distributed.span("zero-code") as dask_id:
            task_trace, _ = client.submit(traced_task, "in block", key="block-1").result()
    trace_hex, request_hex = hex_ids(request)
    assert task_trace == trace_hex
    spans = spans_named(module_otlp_receiver, "zero-code", "in block")
    wait_for_export(client)
    # exported once: not also through the launcher's providers
    assert [s["name"] for s in module_otlp_receiver.spans()].count("zero-code") == 1
    dask_span, own = spans["zero-code"], spans["in block"]
    assert dask_span["traceId"] == own["traceId"] == trace_hex
    assert dask_span["spanId"] == f"{otel_span_id(dask_id):016x}"
    assert dask_span["parentSpanId"] == request_hex


def test_a_bare_submission_runs_in_the_callers_trace_and_its_span_links_to_it(
        client, instrumented, module_otlp_receiver):
    tracer = TracerProvider().get_tracer("web-app")
    token = otel_context.attach(baggage.set_baggage("tenant", "acme"))
    try:
        with tracer.start_as_current_span("web request") as request:
            task_trace, task_baggage = client.submit(
                traced_task, "bare task", key="bare-1").result()
    finally:
        otel_context.detach(token)
    trace_hex, request_hex = hex_ids(request)
    assert (task_trace, task_baggage) == (trace_hex, {"tenant": "acme"})
    wait_for_export(client)
    own = spans_named(module_otlp_receiver, "bare task")["bare task"]
    assert (own["traceId"], own["parentSpanId"]) == (trace_hex, request_hex)
    links = [link for s in module_otlp_receiver.spans()
             if s["name"] == names.DEFAULT_SPAN_TAG for link in s.get("links", ())]
    assert [(link["traceId"], link["spanId"]) for link in links] == [
        (trace_hex, request_hex)]


SCRIPT = (
    "import sys, distributed\n"
    "from test_zero_code import traced_task\n"
    "with distributed.Client(sys.argv[1]) as client:\n"
    "    with distributed.span('batch'):\n"
    "        print(client.submit(traced_task, 'in batch', key='batch-1').result()[0])\n"
)


def test_traceparent_parents_a_scripts_spans(launched, client, module_otlp_receiver):
    """A batch script started by an orchestrator with ``TRACEPARENT`` set, under the
    launcher, with plain dask code."""
    trace_hex, parent_hex = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    env = {**launched.env, "OTEL_TRACES_EXPORTER": "none",
           "OTEL_METRICS_EXPORTER": "none",
           "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), *sys.path]),
           "TRACEPARENT": f"00-{trace_hex}-{parent_hex}-01"}
    out = subprocess.run(
        [opentelemetry_instrument(), sys.executable, "-c", SCRIPT, launched.address],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    ).stdout
    assert out.strip().splitlines()[-1] == trace_hex
    wait_for_export(client)
    batch = spans_named(module_otlp_receiver, "batch")["batch"]
    assert (batch["traceId"], batch["parentSpanId"]) == (trace_hex, parent_hex)


CHECK = (
    "import json, dask, distributed, dask_otel_spans\n"
    "print(json.dumps([dask.config.get('distributed.scheduler.preload'),"
    " dask.config.get('distributed.worker.preload'),"
    " distributed.span is dask_otel_spans.span]))\n"
)


@pytest.mark.parametrize("disabled, expected", [
    ("", [["dask_otel_spans"], ["dask_otel_spans"], True]),
    ("urllib, dask", [[], [], False]),
])
def test_the_disable_variable_turns_it_off(disabled, expected, tmp_path):
    """``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=dask``: the launcher's own rule, by the
    entry point's name."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path),
           "OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none",
           "OTEL_LOGS_EXPORTER": "none",
           "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS": disabled}
    out = subprocess.run(
        [opentelemetry_instrument(), sys.executable, "-c", CHECK], env=env,
        cwd=str(tmp_path), capture_output=True, text=True, timeout=60, check=True,
    ).stdout
    assert json.loads(out.strip().splitlines()[-1]) == expected


FILE_EXPORTER_ENV = {"OTEL_TRACES_EXPORTER": "otlp_json_file",
                     "OTEL_METRICS_EXPORTER": "otlp_json_file",
                     "OTEL_LOGS_EXPORTER": "otlp_json_file",
                     "DASK_OTEL_SPANS__IDLE_TIMEOUT": "1s"}


def test_the_file_exporter_value_works_under_the_launcher(tmp_path):
    """``OTEL_*_EXPORTER=otlp_json_file`` under ``opentelemetry-instrument``: the
    launcher's configurator finds the package's exporters by their entry points, the
    plugins load, and each process writes its own files below the output directory
    (the scheduler's export process at its top, each worker in ``workers/*/``)."""
    procs = DaskProcesses(FILE_EXPORTER_ENV, cwd=str(tmp_path), nanny=True,
                          scheduler_preload=False, launcher=(opentelemetry_instrument(),))
    try:
        with Client(procs.address, timeout=60) as client:
            client.wait_for_workers(1, timeout=60)
            assert client.run_on_scheduler(plugins_of) == [names.PLUGIN_NAME]
            with distributed.span("launched with files"):
                client.submit(traced_task, "in file task", key="file-1").result()
            state = wait_for_export(client)
    finally:
        log = procs.stop()
    assert "Failed to auto initialize" not in log and "Traceback" not in log, log
    out = tmp_path / "dask-otel-spans"
    assert state.traces_to == str(out / "traces.jsonl")
    assert "launched with files" in {s["name"] for s in read_spans(str(out / "traces.jsonl"))}
    in_task = [s["name"] for path in (out / "workers").glob("*/traces.jsonl")
               for s in read_spans(str(path))]
    assert in_task == ["in file task"]
    assert (out / "metrics.jsonl").stat().st_size > 0

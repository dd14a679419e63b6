"""Zero-code, under the real launcher: ``opentelemetry-instrument dask scheduler`` and
``opentelemetry-instrument dask worker ADDR`` (under a nanny), with no ``--preload``,
load the package's plugins, once each; a client's plain ``distributed.span`` under
instrumentation is exported as the child of the client's span, and task code runs in
its trace. ``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=dask`` turns it off."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import distributed
import pytest
from distributed import Client
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.util._importlib_metadata import entry_points
from support.polling import wait_for
from support.processes import DaskProcesses, opentelemetry_instrument, otlp_grpc_env

from dask_otel_spans import names, wait_for_export
from dask_otel_spans.instrumentation import DaskInstrumentor
from dask_otel_spans.protocol.propagation import otel_span_id


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


def traced_task() -> str:
    """Task code: a span of its own, with the global tracer (the launcher's)."""
    from opentelemetry import trace

    with trace.get_tracer("task code").start_as_current_span("in task") as own:
        return f"{own.get_span_context().trace_id:032x}"


def export_process_of(dask_scheduler) -> bool:
    """run_on_scheduler: whether the plugin exports from an export process."""
    return dask_scheduler.plugins[names.PLUGIN_NAME].destinations["export_process"]


def test_the_launcher_loads_both_plugins_without_a_preload(otlp_receiver, tmp_path):
    procs = DaskProcesses(
        {**otlp_grpc_env(otlp_receiver), "OTEL_LOGS_EXPORTER": "none",
         "OTEL_SERVICE_NAME": "zero-code"},
        cwd=str(tmp_path), nanny=True, scheduler_preload=False,
        launcher=(opentelemetry_instrument(),),
    )
    instrumentor = DaskInstrumentor()
    log = ""
    try:
        with Client(procs.address, timeout=60) as client:
            client.wait_for_workers(1, timeout=60)
            assert client.run_on_scheduler(plugins_of) == [names.PLUGIN_NAME]
            # the launcher's global providers come from OTEL_*: the plugin exports
            # from its export process, built from the same variables
            assert client.run_on_scheduler(export_process_of) is True
            assert list(client.run(plugins_of).values()) == [[names.WORKER_PLUGIN_NAME]]

            instrumentor.instrument()  # (this client: plain distributed.span)
            tracer = TracerProvider().get_tracer("client-app")
            with tracer.start_as_current_span("client request") as request:
                with distributed.span("zero-code") as dask_id:
                    task_trace = client.submit(traced_task, key="traced-1").result()
            instrumentor.uninstrument()

            trace_hex = f"{request.get_span_context().trace_id:032x}"
            assert task_trace == trace_hex

            def exported():
                spans = {s["name"]: s for s in otlp_receiver.spans()}
                return spans if {"zero-code", "in task"} <= set(spans) else None

            spans = wait_for(exported, timeout=30)
            wait_for_export(client)
            # exported once: not also through the launcher's providers
            assert [s["name"] for s in otlp_receiver.spans()].count("zero-code") == 1
            dask_span, own = spans["zero-code"], spans["in task"]
            assert dask_span["traceId"] == own["traceId"] == trace_hex
            assert dask_span["spanId"] == f"{otel_span_id(dask_id):016x}"
            assert dask_span["parentSpanId"] == (
                f"{request.get_span_context().span_id:016x}")
    finally:
        if instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.uninstrument()
        log = procs.stop()
    assert "Failed to start preload" not in log, log
    assert "already contains a plugin" not in log, log


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

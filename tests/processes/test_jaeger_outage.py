"""Delivery through an outage of the real backend: the Jaeger binary that
``deploy/jaeger/build.sh`` builds (``deploy/jaeger/config.yaml``), stopped while a
workflow of real ``dask scheduler --preload dask_otel_spans`` and ``dask worker``
processes ends, then started again on the same ports: every span of the workflow is in
Jaeger once, after the export process sent what it held."""
from __future__ import annotations

import uuid

import pytest
from distributed import Client
from support.jaeger import Jaeger, export_env, traced_task, wait_for_spans
from support.paths import DEPLOY
from support.polling import wait_for
from support.processes import DaskProcesses

from dask_otel_spans import names, span, wait_for_export
from dask_otel_spans.client import scheduler_state

#: runs the Jaeger binary: waits for its build on a fresh machine (tests/conftest.py)
pytestmark = pytest.mark.jaeger


def held(client: Client) -> int:
    state = client.run_on_scheduler(scheduler_state)
    return state.held.get("traces", 0) + state.spooled.get("traces", 0)


def test_a_workflow_that_ends_while_jaeger_is_down_is_all_in_jaeger_after(tmp_path):
    # (the config has a Prometheus exporter: moved off its fixed port, as another
    # test file's Jaeger may run beside this one)
    jaeger = Jaeger(DEPLOY / "jaeger" / "config.yaml", tmp_path / "jaeger.log",
                    prometheus_exporter=True)
    procs = DaskProcesses({**export_env(jaeger), "OTEL_METRICS_EXPORTER": "none",
                           "OTEL_EXPORTER_OTLP_TIMEOUT": "1"}, cwd=str(tmp_path))
    try:
        with Client(procs.address, timeout=60) as client:
            client.wait_for_workers(1, timeout=60)
            jaeger.stop()
            with span("through a restart") as span_id:
                client.gather(client.map(traced_task, range(4)))
            wait_for(lambda: held(client) >= 2, timeout=60)  # (the span, its prefix)
            jaeger.start()
            state = wait_for(lambda: (s := wait_for_export(client)).flushed and s,
                             timeout=60)
            assert state.traces_failed == 0 and state.dropped.get("traces", 0) == 0
    finally:
        procs.stop()
    try:
        # (no client span: the trace id is the root dask span's UUID)
        trace_id = f"{uuid.UUID(span_id).int:032x}"
        spans = wait_for_spans(jaeger, trace_id, lambda spans: spans if {
            "through a restart", "traced_task"} <= {s["name"] for s in spans} else None)
        ids = [s["spanId"] for s in spans]
        assert len(ids) == len(set(ids)) == 2
        (dask_span,) = [s for s in spans if s["name"] == "through a restart"]
        assert dask_span["attrs"][names.SPAN_ID] == span_id
    finally:
        jaeger.stop()

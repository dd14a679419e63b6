"""A running workflow visible in the real backend before it ends: real ``dask
scheduler --preload dask_otel_spans`` and ``dask worker`` processes with
``live.pending-spans`` on, exporting into the Jaeger binary that
``deploy/jaeger/build.sh`` builds (``deploy/jaeger/config.yaml``)."""
from __future__ import annotations

import uuid

import pytest
from distributed import Client, Event
from support.jaeger import Jaeger, export_env, wait_for_spans
from support.paths import DEPLOY
from support.processes import DaskProcesses

from dask_otel_spans import names, span

#: runs the Jaeger binary: waits for its build on a fresh machine (tests/conftest.py)
pytestmark = pytest.mark.jaeger


def wait_for_release(name: str) -> str:
    Event(name).wait(60)
    return name


def is_pending(jaeger_span: dict) -> bool:
    return jaeger_span["attrs"].get(names.SPAN_STATE) == names.SPAN_STATE_RUNNING


def test_a_running_workflow_is_in_jaeger_before_it_ends(tmp_path):
    # (the config has a Prometheus exporter: moved off its fixed port, as another
    # test file's Jaeger may run beside this one)
    jaeger = Jaeger(DEPLOY / "jaeger" / "config.yaml", tmp_path / "jaeger.log",
                    prometheus_exporter=True)
    procs = DaskProcesses({**export_env(jaeger), "OTEL_METRICS_EXPORTER": "none",
                           "OTEL_BSP_SCHEDULE_DELAY": "100",
                           "DASK_OTEL_SPANS__LIVE__AFTER": "0s",
                           "DASK_OTEL_SPANS__LIVE__INTERVAL": "0.5s",
                           "DASK_OTEL_SPANS__LIVE__PENDING_SPANS": "true"},
                          cwd=str(tmp_path))
    try:
        with Client(procs.address, timeout=60) as client:
            client.wait_for_workers(1, timeout=60)
            release = Event("release-nightly", client=client)
            with span("nightly") as span_id:
                running = client.submit(wait_for_release, "release-nightly",
                                        pure=False)
                # (no client span: the trace id is the root dask span's UUID)
                trace_id = f"{uuid.UUID(span_id).int:032x}"
                while_running = wait_for_spans(
                    jaeger, trace_id,
                    lambda spans: spans if any(map(is_pending, spans)) else None,
                    timeout=60)
                release.set()
                running.result(timeout=60)
        ended = wait_for_spans(jaeger, trace_id, lambda spans: spans if any(
            s["name"] == "nightly" and not is_pending(s) for s in spans) else None,
            timeout=60)
    finally:
        procs.stop()
        jaeger.stop()
    # while it ran: pending spans only, children of the id the span ends with
    assert not [s for s in while_running if not is_pending(s) and s["name"] == "nightly"]
    (exported,) = [s for s in ended if s["name"] == "nightly" and not is_pending(s)]
    pending = [s for s in while_running if is_pending(s)]
    assert {s["parentSpanId"] for s in pending} == {exported["spanId"]}
    assert pending[0]["attrs"][names.SPAN_ID] == span_id

"""A real ``dask scheduler --preload dask_otel_spans`` whose export runs in its export
process imports nothing of the export side, the OTel SDK or protobuf, and exports."""
from __future__ import annotations

import sys

import pytest
from distributed import Client
from support.processes import DaskProcesses, otlp_grpc_env

from dask_otel_spans import span, wait_for_export

#: What the scheduler process must not import (the export process does)
EXPORT_SIDE = ("opentelemetry.sdk", "google.protobuf", "opentelemetry.exporter",
               "dask_otel_spans.export", "dask_otel_spans.sdk")


@pytest.fixture
def process_cluster(otlp_receiver, tmp_path):
    procs = DaskProcesses(otlp_grpc_env(otlp_receiver), cwd=str(tmp_path))
    try:
        yield procs
    finally:
        procs.stop()


def test_a_scheduler_exporting_in_its_export_process_imports_no_sdk(process_cluster):
    with Client(process_cluster.address, timeout=60) as client:
        client.wait_for_workers(1, timeout=60)
        with span("no sdk here"):
            assert client.submit(sum, [1, 1], key="no-sdk-1").result() == 2
        state = wait_for_export(client, timeout=60)
        # (a lambda travels by value: a function of this module would bring the
        # module, and the tests' support code, into the scheduler)
        modules = client.run_on_scheduler(lambda: sorted(sys.modules))
    assert state.export_process and state.open == 0
    assert state.traces_delivered and state.traces_delivered >= state.handed_over > 0
    assert [m for m in modules if m.startswith(EXPORT_SIDE)] == []

"""The export process of a real ``dask scheduler --preload dask_otel_spans``, turned
on by dask config: it exports over OTLP/gRPC, and ends with its scheduler."""
from __future__ import annotations

import psutil
import pytest
from distributed import Client
from distributed.utils_test import inc
from support.polling import wait_for
from support.processes import DaskProcesses, otlp_grpc_env

from dask_otel_spans import names, span


def export_children(pid: int) -> list[psutil.Process]:
    """The export processes of the scheduler ``pid``."""
    return [
        p for p in psutil.Process(pid).children(recursive=True)
        if "dask_otel_spans.transport.child" in " ".join(p.cmdline())
    ]


@pytest.fixture
def process_cluster(otlp_receiver, tmp_path):
    procs = DaskProcesses(
        {**otlp_grpc_env(otlp_receiver), "DASK_OTEL_SPANS__EXPORT_PROCESS": "true"},
        cwd=str(tmp_path),
    )
    try:
        yield procs
    finally:
        procs.stop()


def test_dask_config_turns_the_export_process_on_in_a_real_scheduler(
    process_cluster, otlp_receiver
):
    with Client(process_cluster.address, timeout=60) as client:
        client.wait_for_workers(1, timeout=60)
        [child] = wait_for(lambda: export_children(process_cluster.scheduler.pid))
        with span("over otlp") as span_id:
            assert client.submit(inc, 1, key="o-1").result() == 2
        [received] = wait_for(
            lambda: [s for s in otlp_receiver.spans() if s["name"] == "over otlp"],
            timeout=60,
        )
    assert received["attributes"][names.SPAN_ID] == span_id
    log = process_cluster.stop()
    assert "export process pid" in log  # (the start's INFO line)
    for trouble in ("did not start", "exited with code", "starting a new export",
                    "exporting in the scheduler process", "Traceback"):
        assert trouble not in log
    wait_for(lambda: not child.is_running() or child.status() == "zombie")
    sums = otlp_receiver.latest_sums("dask.span.activity.time")
    assert any(dict(k).get(names.SPAN_NAME) == "over otlp" for k in sums)


def test_export_process_ends_when_the_scheduler_is_killed(process_cluster):
    [child] = wait_for(lambda: export_children(process_cluster.scheduler.pid), timeout=60)
    process_cluster.scheduler.kill()
    process_cluster.scheduler.wait(30)
    # its stdin ended with the scheduler: it finishes and exits
    wait_for(lambda: not child.is_running() or child.status() == "zombie", timeout=30)

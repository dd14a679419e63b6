"""Tail sampling that keeps failures, for real: ``deploy/jaeger/tail-sampling.yaml`` runs
in the Jaeger binary that ``deploy/jaeger/build.sh`` builds, with its probabilistic
policy at 0 % (``TAIL_SAMPLING_PERCENTAGE=0``) and a short decision wait, so that only
its ``status_code: ERROR`` policy keeps traces. Real ``dask scheduler --preload
dask_otel_spans`` and ``dask worker --preload dask_otel_spans`` processes and a client
export into it; a workflow where a task raises is kept whole (client, scheduler and
worker spans), one where nothing erred is dropped."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from distributed import Client
from support.jaeger import (
    Jaeger,
    check,
    client_tracer,
    export_env,
    traced_task,
    wait_for_spans,
)
from support.paths import DEPLOY
from support.processes import DaskProcesses

from dask_otel_spans import span, wait_for_export

#: runs the Jaeger binary: waits for its build on a fresh machine (tests/conftest.py)
pytestmark = pytest.mark.jaeger

DECISION_WAIT, N_CHECKED = "3s", 4


@pytest.fixture(scope="module")
def sampling_jaeger(tmp_path_factory) -> Iterator[Jaeger]:
    """``deploy/jaeger/tail-sampling.yaml`` in the real binary, started once."""
    server = Jaeger(DEPLOY / "jaeger" / "tail-sampling.yaml",
                    tmp_path_factory.mktemp("jaeger") / "jaeger.log",
                    env={"TAIL_SAMPLING_PERCENTAGE": "0",
                         "TAIL_SAMPLING_DECISION_WAIT": DECISION_WAIT})
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def two_workflows(sampling_jaeger: Jaeger, tmp_path_factory) -> Iterator[dict[str, Any]]:
    """A workflow where nothing errs, then one where a task raises, each under a client
    span of its own: their trace ids."""
    procs = DaskProcesses({**export_env(sampling_jaeger), "OTEL_METRICS_EXPORTER": "none"},
                          cwd=str(tmp_path_factory.mktemp("dask")), worker_preload=True)
    provider = client_tracer(sampling_jaeger)
    tracer = provider.get_tracer("client-app")
    try:
        with Client(procs.address, timeout=60) as client:
            client.wait_for_workers(1, timeout=60)
            with tracer.start_as_current_span("fine request") as fine:
                with span("fine workflow"):
                    client.gather(client.map(traced_task, range(3)))
            # (all of the fine trace is in before the erred trace starts)
            assert wait_for_export(client).flushed
            with tracer.start_as_current_span("erred request") as erred:
                with span("erred workflow"):
                    with span("load"):
                        client.gather(client.map(traced_task, range(10, 13)))
                    with span("validate"):
                        client.gather(client.map(check, range(N_CHECKED)), errors="skip")
            assert wait_for_export(client).flushed
    finally:
        provider.shutdown()
        procs.stop()
    yield {"fine": f"{fine.get_span_context().trace_id:032x}",
           "erred": f"{erred.get_span_context().trace_id:032x}"}


def test_tail_sampling_keeps_the_erred_trace_whole_and_drops_the_fine_one(
        sampling_jaeger, two_workflows):
    whole = {"erred request": 1, "erred workflow": 1, "load": 1, "validate": 1,
             "traced_task": 1, "in task": 3, "check": 2, "check record": N_CHECKED}

    def complete(spans):
        counts = {name: sum(s["name"] == name for s in spans) for name in whole}
        return spans if counts == whole else None

    spans = wait_for_spans(sampling_jaeger, two_workflows["erred"], complete, timeout=60)
    # whole: the spans without an error (the client's, the load step's, the
    # workers') were kept with the erred ones, and nothing else is in it
    assert len(spans) == sum(whole.values())
    assert {s["resource"]["service.name"] for s in spans} == {
        "test-client", "dask-scheduler", "dask-worker"}
    # the fine trace's decision came before the erred trace's last spans arrived
    assert sampling_jaeger.trace_v3(two_workflows["fine"]) == []
    assert sampling_jaeger.get("/api/v3/traces/" + two_workflows["fine"]) is None

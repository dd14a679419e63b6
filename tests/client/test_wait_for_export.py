"""``wait_for_export``: the same documented fields in every state, and the truth
about delivery (a scheduler without the plugin, an idle plugin, a collector that is
down, one that is up)."""
from __future__ import annotations

import dataclasses
import logging
import time

import pytest
from distributed import Client, LocalCluster
from distributed.utils_test import captured_logger, gen_cluster
from support.processes import free_port, otlp_grpc_env
from support.receivers import OTLPReceiver

from dask_otel_spans import OTelSpansPlugin, names, span, wait_for_export
from dask_otel_spans.client import PluginMissing
from dask_otel_spans.state import IDLE, ExportState


def inc(x: int) -> int:
    return x + 1


@pytest.fixture
def client():
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address=":0") as cluster, Client(cluster) as c:
        yield c


def register(client: Client, environ: dict[str, str], tmp_path) -> None:
    client.register_plugin(OTelSpansPlugin(
        environ=environ, use_global_providers=False, export_process=False,
        export_delay=0, output_dir=str(tmp_path),
        # (the cluster's close, at the end, waits no longer for a collector down)
        shutdown_timeout=0.5,
    ))


def run_one_span(client: Client) -> None:
    with span("one step"):
        client.submit(inc, 1, key="one-1").result()


@pytest.mark.cluster  # (a LocalCluster)
def test_without_the_plugin_it_raises_naming_the_preload(client):
    with pytest.raises(PluginMissing, match="--preload dask_otel_spans"):
        wait_for_export(client, timeout=1)


@pytest.mark.cluster  # (a LocalCluster)
def test_an_idle_plugin_reports_nowhere_and_not_flushed(client, tmp_path):
    register(client, {"OTEL_TRACES_EXPORTER": "zipkin"}, tmp_path)
    state = wait_for_export(client, timeout=5)
    assert state == ExportState(
        traces_to=IDLE, metrics_to=IDLE, export_process=False, open=0, handed_over=0,
        traces_delivered=None, traces_failed=None, metrics_delivered=None,
        metrics_failed=None, flushed=False,
    )


@pytest.mark.cluster  # (a LocalCluster)
def test_with_the_collector_down_nothing_counts_as_delivered(client, tmp_path):
    environ = {
        **otlp_grpc_env(OTLPReceiver(port=free_port())),  # (never started)
        "OTEL_METRICS_EXPORTER": "none", "OTEL_EXPORTER_OTLP_TIMEOUT": "1",
    }
    register(client, environ, tmp_path)
    run_one_span(client)
    started = time.monotonic()
    state = wait_for_export(client, timeout=20)
    # (the flush tries the collector twice, a second apart, not for its whole 10 s)
    assert time.monotonic() - started < 8
    assert state.open == 0 and state.handed_over == 1
    # (the dask span and its prefix span: held to be sent again, not failed)
    assert state.traces_delivered == 0 and state.traces_failed == 0
    assert state.held.get("traces", 0) + state.spooled.get("traces", 0) == 2
    assert state.flushed is False


@pytest.mark.cluster  # (a LocalCluster)
def test_with_the_collector_up_delivered_spans_and_points_are_counted(
    otlp_receiver, client, tmp_path
):  # (the receiver first: it outlives the cluster, whose close exports once more)
    register(client, otlp_grpc_env(otlp_receiver), tmp_path)
    run_one_span(client)
    state = wait_for_export(client, timeout=20)
    assert state.flushed is True and state.open == 0 and state.handed_over == 1
    assert state.traces_delivered == 2 == len(otlp_receiver.spans())
    assert state.traces_failed == 0 and state.metrics_failed == 0
    assert state.metrics_delivered > 0
    assert state.traces_to == f"OTLP grpc to {otlp_receiver.endpoint}"


def test_every_state_has_the_documented_fields():
    documented = {"traces_to", "metrics_to", "export_process", "open", "handed_over",
                  "traces_delivered", "traces_failed", "metrics_delivered",
                  "metrics_failed", "flushed", "held", "spooled", "dropped", "spool",
                  "resent"}
    assert {f.name for f in dataclasses.fields(ExportState)} == documented
    assert all(f"{name}:" in ExportState.__doc__ or f"{name}," in ExportState.__doc__
               for name in documented)


@pytest.mark.cluster  # (a LocalCluster)
def test_the_exporters_are_flushed_once_however_long_it_waits(otlp_receiver, client,
                                                              tmp_path):
    """(A flush is an export: each one would replace what a Collector's Prometheus
    exporter holds of a series, exemplars included.)"""
    client.register_plugin(OTelSpansPlugin(
        environ=otlp_grpc_env(otlp_receiver), use_global_providers=False,
        export_process=False, export_delay=1.5, output_dir=str(tmp_path)))
    run_one_span(client)
    before = len(otlp_receiver.metric_requests)
    started = time.monotonic()
    state = wait_for_export(client, timeout=20)
    assert time.monotonic() - started > 0.5  # (it polled while the span was open)
    assert state.flushed is True and state.handed_over == 1
    assert len(otlp_receiver.metric_requests) - before == 1


DELIVERED = ExportState(
    traces_to="the collector", metrics_to="the collector", export_process=True, open=0,
    handed_over=1, traces_delivered=2, traces_failed=0, metrics_delivered=5,
    metrics_failed=0, flushed=True,
)


def test_an_idle_plugins_outcome_says_only_that_it_is_idle():
    idle = dataclasses.replace(
        DELIVERED, traces_to=IDLE, metrics_to=IDLE, traces_delivered=None,
        traces_failed=None, metrics_delivered=None, metrics_failed=None, flushed=False)
    for said in (idle.outcome(), idle.outcome("traces"), idle.outcome("metrics")):
        assert "idle" in said and "ERROR line" in said
        assert "not counted" not in said


def test_an_unknown_signal_is_a_value_error_naming_the_signals():
    with pytest.raises(ValueError, match="traces, metrics, logs"):
        DELIVERED.outcome("bogus")


def test_the_outcome_of_logs_says_what_the_state_holds_of_them():
    holding = dataclasses.replace(DELIVERED, held={"logs": 3}, spooled={"logs": 0},
                                  dropped={"logs": 0})
    said = holding.outcome("logs")
    assert said.startswith("logs") and "3 still held in memory" in said
    assert "metrics" not in said.split(":")[0]
    assert "not counted" not in DELIVERED.outcome("logs")


def test_the_outcome_without_a_signal_says_every_signal():
    said = dataclasses.replace(DELIVERED, held={"logs": 1}).outcome()
    assert said.splitlines() == [
        DELIVERED.outcome("traces"), DELIVERED.outcome("metrics"),
        dataclasses.replace(DELIVERED, held={"logs": 1}).outcome("logs")]
    assert DELIVERED.outcome().splitlines()[1].startswith("metrics to the collector: 5")


def test_the_outcome_tells_of_spans_still_open():
    still_open = dataclasses.replace(DELIVERED, open=1, handed_over=0,
                                     traces_delivered=0)
    said = still_open.outcome("traces")
    assert said.startswith("traces to the collector: 0 spans delivered, 0 failed")
    assert "1 dask span still open" in said
    assert "still open" not in DELIVERED.outcome("traces")


@pytest.mark.cluster  # (a LocalCluster)
def test_waiting_logs_no_line_per_poll_on_the_scheduler(client, tmp_path):
    register(client, {"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"},
             tmp_path)
    with captured_logger("distributed.worker", level=logging.INFO) as log, \
            span("still open"):
        client.submit(inc, 1, key="open-1").result()
        state = wait_for_export(client, timeout=1)  # (polls while the block is open)
    assert state.open == 1
    assert "Run out-of-band function" not in log.getvalue()


@pytest.mark.cluster  # (a LocalCluster)
def test_a_plugin_of_an_earlier_version_is_asked_with_run_on_scheduler(client, tmp_path):
    """(One that sets no state metadata, and registers no handler.)"""
    register(client, {"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"},
             tmp_path)

    def as_earlier_versions(dask_scheduler) -> None:
        dask_scheduler.set_metadata(keys=list(names.PLUGIN_STATE_METADATA_KEYS),
                                    value=None)
        del dask_scheduler.handlers[names.STATE_HANDLER]

    client.run_on_scheduler(as_earlier_versions)
    run_one_span(client)
    with captured_logger("distributed.worker", level=logging.INFO) as log:
        state = wait_for_export(client, timeout=20)
    assert state.open == 0 and state.handed_over == 1 and state.flushed is True
    assert "Run out-of-band function 'scheduler_state'" in log.getvalue()


@gen_cluster(client=True)
async def test_an_asynchronous_client_awaits_it(c, s, a, b, tmp_path):
    await c.register_plugin(OTelSpansPlugin(
        environ={"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"},
        use_global_providers=False, export_process=False, export_delay=0,
        output_dir=str(tmp_path)))
    with span("awaited"):
        assert await c.submit(inc, 1, key="awaited-1") == 2
    state = await wait_for_export(c, timeout=20)
    assert state.open == 0 and state.handed_over == 1 and state.flushed is True


def lazy_notices(client_id: str, n: int) -> list[dict[str, object]]:
    """Close notices of ``n`` blocks without tasks whose collections are still to be
    computed: each span waits for its client alone (``lazy-timeout``, or its graph)."""
    now = time.time()
    return [{"ids": [f"{client_id}-{i}"], "name": ["lazy"], "opened": 1,
             "enter": now - 1, "exit": now, "lazy": True, "client": client_id}
            for i in range(n)]


@gen_cluster(client=True)
async def test_spans_that_wait_for_another_client_alone_are_not_waited_for(
        c, s, a, b, tmp_path):
    await c.register_plugin(OTelSpansPlugin(
        environ={"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"},
        use_global_providers=False, export_process=False, export_delay=0,
        output_dir=str(tmp_path)))
    await c.log_event(names.EVENT_TOPIC, lazy_notices("another-client", 100))
    with span("mine"):
        assert await c.submit(inc, 1, key="mine-1") == 2
    t0 = time.monotonic()
    state = await wait_for_export(c, timeout=20)
    assert time.monotonic() - t0 < 10
    assert state.open == 0 and state.handed_over == 1 and state.flushed is True


@gen_cluster(client=True)
async def test_a_clients_own_spans_that_wait_for_it_are_waited_for(c, s, a, b, tmp_path):
    await c.register_plugin(OTelSpansPlugin(
        environ={"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"},
        use_global_providers=False, export_process=False, export_delay=0,
        output_dir=str(tmp_path)))
    await c.log_event(names.EVENT_TOPIC, lazy_notices(c.id, 3))
    state = await wait_for_export(c, timeout=1)
    assert state.open == 3 and state.handed_over == 0

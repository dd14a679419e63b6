"""Pull readers (Prometheus): the package's flush never makes the next scrape repeat a
metric family, as the SDK's own flush does (checked by promtool)."""
from __future__ import annotations

import pytest
from support.prometheus import promtool_check_metrics


@pytest.fixture
def prometheus_meter_provider():
    """A meter provider with a Prometheus reader on a registry of its own, and a
    counter with one point."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import MeterProvider
    from prometheus_client import REGISTRY, generate_latest

    reader = PrometheusMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    provider.get_meter("test").create_counter(
        "dask.test.count", description="A test count"
    ).add(1, {"a": "b"})
    yield provider, lambda: generate_latest(REGISTRY).decode()
    provider.shutdown()


@pytest.mark.cluster  # (promtool)
def test_flushing_never_repeats_a_prometheus_metric_family(prometheus_meter_provider):
    from dask_otel_spans.sdk.providers import flush_provider

    provider, scrape = prometheus_meter_provider
    for _ in range(3):
        assert flush_provider(provider, 1000)
    text = scrape()
    assert text.count("# TYPE dask_test_count_total counter") == 1
    check = promtool_check_metrics(text)
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.cluster  # (promtool)
def test_the_sdks_own_flush_of_a_pull_reader_breaks_the_exposition(
    prometheus_meter_provider
):
    """What :func:`flush_provider` avoids (if the SDK stops queueing a collection per
    flush, this fails and the avoidance can go)."""
    provider, scrape = prometheus_meter_provider
    for _ in range(3):
        provider.force_flush(1000)
    text = scrape()
    assert text.count("# TYPE dask_test_count_total counter") == 4
    assert promtool_check_metrics(text).returncode != 0


def test_a_prometheus_port_is_where_the_series_are_said_to_be(tmp_path):
    """With a port, the series are served there by the process that exports (the
    export process by default), not on the scheduler's own ``/metrics``."""
    from support.processes import free_port

    from dask_otel_spans.sdk.providers import resolve_providers

    port = free_port()
    env = {"OTEL_METRICS_EXPORTER": "prometheus", "OTEL_TRACES_EXPORTER": "none",
           "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
           "OTEL_EXPORTER_PROMETHEUS_PORT": str(port)}
    p = resolve_providers(environ=env, output_dir=str(tmp_path), use_global=False)
    try:
        assert p.metrics_to == f"http://127.0.0.1:{port}/metrics"
    finally:
        for provider in p.owned:
            provider.shutdown()

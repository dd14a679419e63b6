"""Provider resolution: argument, then global, then OTEL_* variables, then default."""
from __future__ import annotations

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from support.polling import wait_for
from support.processes import otlp_grpc_env

from dask_otel_spans import names
from dask_otel_spans.export.caps import SeriesCap, SpanNameCap
from dask_otel_spans.export.metrics import DaskInstruments
from dask_otel_spans.otelenv import ConfigurationError
from dask_otel_spans.sdk.otlp import otlp_exporter_kwargs, parse_headers
from dask_otel_spans.sdk.providers import build_resource, resolve_providers


def _shutdown(p):
    for provider in p.owned:
        provider.shutdown()


def test_unconfigured_environment_uses_embedded_files(tmp_path):
    p = resolve_providers(environ={}, output_dir=str(tmp_path), use_global=False)
    try:
        assert p.traces_to == str(tmp_path / "traces.jsonl")
        assert p.metrics_to == str(tmp_path / "metrics.jsonl")
        # (the records of running spans: logs.jsonl)
        assert p.logs_to == str(tmp_path / "logs.jsonl")
        assert len(p.owned) == 3
    finally:
        _shutdown(p)


def test_live_records_get_the_logger_provider_that_otel_logs_exporter_names(tmp_path):
    p = resolve_providers(environ={"OTEL_TRACES_EXPORTER": "console",
                                   "OTEL_LOGS_EXPORTER": "console"},
                          output_dir=str(tmp_path), use_global=False)
    try:
        assert p.logger_provider is not None and p.logs_to == "the console"
    finally:
        _shutdown(p)


def test_given_providers_without_otel_logs_exporter_get_no_logger_provider(tmp_path):
    tp, mp = TracerProvider(), MeterProvider()
    p = resolve_providers(tracer_provider=tp, meter_provider=mp, environ={},
                          output_dir=str(tmp_path), use_global=False)
    assert p.logger_provider is None and p.owned == []


def test_a_bad_otel_logs_exporter_is_one_error_line_and_no_live_records(
        tmp_path, caplog):
    p = resolve_providers(environ={"OTEL_TRACES_EXPORTER": "console",
                                   "OTEL_LOGS_EXPORTER": "bogus"},
                          output_dir=str(tmp_path), use_global=False)
    try:
        assert p.logger_provider is None
        [line] = [r for r in caplog.records if "OTEL_LOGS_EXPORTER" in r.getMessage()]
        assert line.levelname == "ERROR" and "bogus" in line.getMessage()
    finally:
        _shutdown(p)


def test_explicit_providers_win_and_are_not_owned():
    tp, mp = TracerProvider(), MeterProvider()
    p = resolve_providers(tracer_provider=tp, meter_provider=mp, environ={})
    assert (p.tracer_provider, p.meter_provider, p.owned) == (tp, mp, [])


def test_none_exporter_disables_a_signal(tmp_path):
    env = {"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "console"}
    p = resolve_providers(environ=env, output_dir=str(tmp_path), use_global=False)
    try:
        assert p.tracer_provider is None
        assert p.metrics_to == "the console"
    finally:
        _shutdown(p)


def test_otlp_endpoint_alone_selects_otlp_grpc():
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}
    p = resolve_providers(environ=env, use_global=False)
    try:
        assert p.traces_to == "OTLP grpc to http://127.0.0.1:4317"
    finally:
        _shutdown(p)


def test_unknown_exporter_is_a_configuration_error():
    with pytest.raises(ConfigurationError):
        resolve_providers(environ={"OTEL_TRACES_EXPORTER": "zipkin-v9"}, use_global=False)


def test_http_generic_endpoint_gets_signal_path():
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://collector:4318/"}
    kw = otlp_exporter_kwargs(env, "TRACES", "http/protobuf")
    assert kw["endpoint"] == "https://collector:4318/v1/traces"
    assert otlp_exporter_kwargs(env, "METRICS", "http/protobuf")["endpoint"] == (
        "https://collector:4318/v1/metrics"
    )


def test_signal_specific_settings_win():
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4317",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://b:4317",
        "OTEL_EXPORTER_OTLP_HEADERS": "api-key=generic",
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "api-key=traces",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "3",
    }
    kw = otlp_exporter_kwargs(env, "TRACES", "grpc")
    assert kw["endpoint"] == "http://b:4317"
    assert kw["headers"] == {"api-key": "traces"}
    assert kw["timeout"] == 3.0


def test_grpc_exporter_reconnects_within_seconds():
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4317"}
    exporter = OTLPSpanExporter(**otlp_exporter_kwargs(env, "TRACES", "grpc"))
    options = dict(exporter._channel_options)
    assert options["grpc.max_reconnect_backoff_ms"] <= 5000
    assert "grpc.primary_user_agent" in options  # the SDK's own options are kept
    exporter.shutdown()


def test_headers_are_url_decoded_and_malformed_items_skipped():
    assert parse_headers("Api-Key=a%20b,broken,x=1=2") == {"api-key": "a b", "x": "1=2"}


def test_a_malformed_header_is_said_once_for_every_signal(caplog, monkeypatch):
    """Once by the package, and not again by the SDK's gRPC exporters (which read
    the variable themselves when given no headers)."""
    from dask_otel_spans.sdk.otlp import otlp_exporter

    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317",
           "OTEL_EXPORTER_OTLP_HEADERS": "a-header-without-a-value-9"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    for signal in ("TRACES", "METRICS", "LOGS"):
        otlp_exporter(env, signal)[0].shutdown()
    said = [r for r in caplog.records if "malformed OTLP header" in r.getMessage()]
    assert len(said) == 1
    assert not [r for r in caplog.records if "header" in r.getMessage().lower()
                and r not in said]


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_a_malformed_header_is_said_without_its_text(caplog, monkeypatch, protocol):
    """Neither the package nor the SDK's exporters (OTLP/HTTP ones read the
    variable again) say a header's text: it may be an API key."""
    from dask_otel_spans.sdk.otlp import otlp_exporter

    env = {"OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
           "OTEL_EXPORTER_OTLP_HEADERS": f"api-key:SECRET-sent-over-{protocol}"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    for signal in ("TRACES", "METRICS", "LOGS"):
        otlp_exporter(env, signal)[0].shutdown()
    assert "malformed OTLP header" in caplog.text
    assert "SECRET" not in caplog.text


def test_exceptions_are_not_said_to_go_to_span_events_when_traces_go_nowhere(tmp_path):
    env = {"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "console"}
    p = resolve_providers(environ=env, output_dir=str(tmp_path), use_global=False)
    try:
        assert "span events" not in p.exceptions_to
        assert p.exceptions_to == "nowhere (no traces, no exception logs)"
    finally:
        _shutdown(p)


def test_resource_defaults_and_overrides():
    r = build_resource({}, "tcp://10.0.0.1:8786")
    assert r.attributes[names.SERVICE_NAME] == "dask-scheduler"
    assert r.attributes[names.SCHEDULER_ADDRESS] == "tcp://10.0.0.1:8786"
    r = build_resource(
        {"OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod,service.name=x"}
    )
    assert r.attributes["deployment.environment"] == "prod"
    assert r.attributes[names.SERVICE_NAME] == "x"
    r = build_resource(
        {"OTEL_SERVICE_NAME": "etl", "OTEL_RESOURCE_ATTRIBUTES": "service.name=x"}
    )
    assert r.attributes[names.SERVICE_NAME] == "etl"


def test_built_meter_provider_keeps_max_series_above_the_sdk_default(otlp_receiver):
    # 2,400 series with max-series 3,000: a provider built by the package lets all
    # of them through to a real OTLP receiver (the SDK's default limit is 2,000)
    p = resolve_providers(
        environ=otlp_grpc_env(otlp_receiver), use_global=False, metric_series_limit=3000
    )
    try:
        meter = p.meter_provider.get_meter(names.INSTRUMENTATION_SCOPE)
        instruments = DaskInstruments(meter, SpanNameCap(None, 1000), SeriesCap(3000))
        for i in range(400):
            instruments.add_span_deltas(
                {("execute", f"s{i}", "inc", f"activity-{a}", "seconds"): 1.0
                 for a in range(6)},
                {f"s{i}": (f"workflow-{i}",)},
            )
        instruments.send()
        p.meter_provider.force_flush()
        sums = wait_for(lambda: otlp_receiver.latest_sums(names.SPAN_ACTIVITY_TIME))
    finally:
        _shutdown(p)
    assert len(sums) == 2400
    assert not [attrs for attrs in sums if "otel.metric.overflow" in dict(attrs)]


@pytest.mark.parametrize("folder, expected", [
    (("opentelemetry", "instrumentation", "auto_instrumentation"), True),
    (("site-packages",), False),
])
def test_auto_instrumentation_is_told_by_the_sitecustomize_it_started(
    monkeypatch, tmp_path, folder, expected
):
    import os
    import sys
    import types

    from dask_otel_spans.otelenv import under_auto_instrumentation

    module = types.ModuleType("sitecustomize")
    module.__file__ = os.path.join(str(tmp_path), *folder, "sitecustomize.py")
    monkeypatch.setitem(sys.modules, "sitecustomize", module)
    assert under_auto_instrumentation() is expected


def test_each_resource_built_has_its_own_service_instance_id():
    import uuid

    first, second = (build_resource({})
                     .attributes[names.SERVICE_INSTANCE_ID] for _ in range(2))
    assert first != second and str(uuid.UUID(first)) == first


def test_a_service_instance_id_the_user_set_is_kept(monkeypatch):
    environ = {"OTEL_RESOURCE_ATTRIBUTES": "service.instance.id=scheduler-a"}
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", environ["OTEL_RESOURCE_ATTRIBUTES"])
    assert build_resource(environ).attributes[names.SERVICE_INSTANCE_ID] == "scheduler-a"


@pytest.mark.parametrize("protocol, said", [
    ("grpc", "OTLP grpc to http://localhost:4317"),
    ("http/protobuf", "OTLP http/protobuf to http://localhost:4318/v1/traces"),
])
def test_where_the_default_endpoint_is_is_said_by_its_address(protocol, said):
    from dask_otel_spans.sdk.otlp import otlp_exporter
    from dask_otel_spans.sdk.otlpsend import request_sender

    env = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": protocol}
    sender = request_sender(env, "traces")
    try:
        assert sender.where == said
    finally:
        sender.close()
    exporter, where = otlp_exporter(env, "TRACES")
    exporter.shutdown()
    assert where == said

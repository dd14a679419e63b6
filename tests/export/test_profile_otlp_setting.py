"""``profile.otlp``: the export pipeline's profiles sender, built only when asked, with
the traces' resource; an endpoint it cannot use is one ERROR line and the rest
exports. No cluster (the sending: tests/processes/test_jaeger_profiles.py)."""
from __future__ import annotations

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider

from dask_otel_spans.config import PluginConfig
from dask_otel_spans.export.pipeline import ExportPipeline
from dask_otel_spans.sdk.providers import Providers

ENDPOINT = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}


@pytest.fixture
def built():
    pipelines = []

    def build(environ, **settings):
        provider = TracerProvider(resource=Resource.create({"service.name": "etl"}))
        pipeline = ExportPipeline.build(Providers(provider),
                                        PluginConfig.from_dask_config(**settings), environ)
        pipelines.append(pipeline)
        return pipeline

    yield build
    for pipeline in pipelines:
        pipeline.stop_threads(5)


def test_profiles_are_not_sent_by_default(built):
    assert built(ENDPOINT).profile_sender is None


def test_profile_otlp_sends_with_the_traces_resource(built):
    sender = built(ENDPOINT, profile_otlp=True).profile_sender
    assert sender is not None
    assert sender.resource["service.name"] == "etl"
    assert sender.sender.where == "OTLP grpc to http://127.0.0.1:4317"


def test_an_unusable_profiles_endpoint_is_one_error_line(built, caplog):
    environ = {**ENDPOINT, "OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL": "carrier-pigeon"}
    with caplog.at_level("ERROR", logger="dask_otel_spans"):
        pipeline = built(environ, profile_otlp=True)
    assert pipeline.profile_sender is None
    (line,) = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert "profile.otlp" in line and "OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL" in line
    assert pipeline.ender.thread.running

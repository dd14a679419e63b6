"""A destination's record: what a held batch is bound to (signal, protocol, endpoint, a
digest of its credentials), stored without a secret and read back within bounds; the
same key configured or read back."""
from __future__ import annotations

import json

import pytest

from dask_otel_spans.sdk.destination import (
    Destination,
    destination_of,
    userinfo,
    with_userinfo,
    without_userinfo,
)


def test_the_configured_destination_is_the_one_its_record_gives_back():
    environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://jane:secret@collector:4318",
               "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
               "OTEL_EXPORTER_OTLP_HEADERS": "api-key=k1"}
    destination = destination_of(environ, "traces")
    back = Destination.from_record(destination.record())
    assert back is not None and back.key == destination.key
    assert back.endpoint == "http://collector:4318/v1/traces"


@pytest.mark.parametrize("other", [
    {"OTEL_EXPORTER_OTLP_HEADERS": "api-key=k2"},
    {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://joe:secret@collector:4318"},
    {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://jane:other@collector:4318"},
    {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
])
def test_other_credentials_endpoint_or_protocol_are_another_destination(other):
    environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://jane:secret@collector:4318",
               "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
               "OTEL_EXPORTER_OTLP_HEADERS": "api-key=k1"}
    assert destination_of(environ, "traces").key != destination_of(
        {**environ, **other}, "traces").key


def test_a_record_holds_no_header_value_nor_user_info():
    destination = Destination.of("logs", "grpc", "https://jane:pass-word@host:4317",
                                 {"authorization": "Bearer tok-en"})
    record = destination.record().decode()
    assert "pass-word" not in record and "tok-en" not in record and "jane" not in record


@pytest.mark.parametrize("change", [
    {"signal": "spans"}, {"protocol": "http/json"}, {"credentials": "xyz"},
    {"endpoint": "http://u:p@host:4317"}, {"endpoint": "http://host\n:4317"},
    {"endpoint": "h" * 5000}, {"extra": 1},
])
def test_a_record_out_of_bounds_is_no_destination(change):
    fields = json.loads(Destination.of("logs", "grpc", "http://host:4317", {}).record())
    assert Destination.from_record(json.dumps({**fields, **change}).encode()) is None


@pytest.mark.parametrize("url, info, bare", [
    ("http://jane:secret@host:4318/v1/traces", "jane:secret", "http://host:4318/v1/traces"),
    ("jane:secret@host:4317", "jane:secret", "host:4317"),
    ("http://host:4318/a@b", "", "http://host:4318/a@b"),
])
def test_user_info_is_taken_out_and_put_back(url, info, bare):
    assert (userinfo(url), without_userinfo(url)) == (info, bare)
    assert with_userinfo(bare, info) == url

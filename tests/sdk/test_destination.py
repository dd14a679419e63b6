"""A signal's destination: said with user info masked, identified by a digest of its
credentials from which they cannot be read, the same for the same configuration."""
from __future__ import annotations

import pytest

from dask_otel_spans.sdk.destination import (
    Destination,
    credentials_digest,
    destination_of,
)

SECRET = "api-key-SECRET-5678"
ENVIRON = {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
           "OTEL_EXPORTER_OTLP_ENDPOINT": "http://ann:pa55word@collector:4318",
           "OTEL_EXPORTER_OTLP_HEADERS": f"api-key={SECRET},x-team=blue"}


def test_a_destination_is_said_with_its_user_info_masked():
    d = destination_of(ENVIRON, "traces")
    assert d.shown == "http://ann:***@collector:4318/v1/traces"
    assert (d.signal, d.protocol) == ("traces", "http/protobuf")


def test_nothing_said_of_a_destination_holds_a_secret():
    d = destination_of(ENVIRON, "traces")
    for said in (d.shown, d.key, d.credentials):
        assert SECRET not in said and "pa55word" not in said


def test_the_credentials_digest_ignores_header_order_and_name_case():
    assert (credentials_digest({"A": "1", "b": "2"}, "u:p")
            == credentials_digest({"B": "2", "a": "1"}, "u:p"))


def test_the_credentials_digest_is_a_slow_salted_one():
    # (a spool file's digest is readable by its owner: a guess at a weak password
    # must cost what a password hash's does, not one SHA-256)
    import hashlib

    from dask_otel_spans.sdk.destination import DIGEST_ITERATIONS

    material = "api-key\0hunter2\0userinfo\0"
    assert DIGEST_ITERATIONS >= 100_000
    assert credentials_digest({"api-key": "hunter2"}) == hashlib.pbkdf2_hmac(
        "sha256", material.encode(), b"dask-otel-spans credentials", DIGEST_ITERATIONS,
        dklen=16).hex()
    assert credentials_digest({"api-key": "hunter2"}) != hashlib.sha256(
        b"dask-otel-spans credentials\0" + material.encode()).hexdigest()[:32]


@pytest.mark.parametrize("change", [
    {"OTEL_EXPORTER_OTLP_HEADERS": f"api-key={SECRET}x,x-team=blue"},
    {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://ann:other@collector:4318"},
])
def test_other_credentials_make_another_destination(change):
    same, other = destination_of(ENVIRON, "traces"), destination_of(
        {**ENVIRON, **change}, "traces")
    assert same.credentials != other.credentials and same.key != other.key
    assert same == destination_of(dict(ENVIRON), "traces")


@pytest.mark.parametrize("change", [
    {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
    {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://elsewhere:4318/v1/traces"},
])
def test_another_protocol_or_endpoint_is_another_destination(change):
    assert destination_of(ENVIRON, "traces").key != destination_of(
        {**ENVIRON, **change}, "traces").key


def test_each_signal_has_its_own_destination():
    assert destination_of(ENVIRON, "traces").key != destination_of(ENVIRON, "logs").key


def test_with_nothing_configured_the_destination_is_the_sdks_default():
    assert destination_of({}, "metrics") == Destination(
        "metrics", "grpc", "http://localhost:4317", credentials_digest({}))

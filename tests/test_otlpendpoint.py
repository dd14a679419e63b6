"""How an OTLP endpoint is said and taken apart (pure): user info masked wherever it
is, in every form an endpoint variable takes; the user info itself, the URL without
it, and the Basic credentials it makes."""
from __future__ import annotations

import base64

import pytest

from dask_otel_spans.otlpendpoint import (
    basic_authorization,
    configured_endpoint,
    masked,
    userinfo,
    without_userinfo,
)


@pytest.mark.parametrize("url, said", [
    ("http://user:s3cret@host:4318", "http://user:***@host:4318"),
    ("https://user:s3cret@host/v1/traces?x=1#f", "https://user:***@host/v1/traces?x=1#f"),
    ("http://user:@host:4318", "http://user:***@host:4318"),
    ("http://t0ken@host:4318", "http://***@host:4318"),
    ("http://us%40er:p%40ss@host:4318/", "http://us%40er:***@host:4318/"),
    ("http://user:p@ss@host:4318", "http://user:***@host:4318"),
    ("user:s3cret@host:4317", "user:***@host:4317"),
    ("//user:s3cret@host:4317", "//user:***@host:4317"),
    ("http://user:s3cret@[::1]:4318", "http://user:***@[::1]:4318"),
    ("http://user:s3cret@[::1", "http://user:***@[::1"),
    ("http://user:pa/ss@host:4318", "http://user:***@host:4318"),
    ("http://user:pa#ss@host:4318/v1/traces", "http://user:***@host:4318/v1/traces"),
    ("http://user:s3cret@host:4318/p@th", "http://user:***@host:4318/p@th"),
    ("http://host:4318/v1/traces", "http://host:4318/v1/traces"),
    ("http://host/path@with-at", "http://host/path@with-at"),
    ("otel-collector:4317", "otel-collector:4317"),
    ("unix:///run/otlp.sock", "unix:///run/otlp.sock"),
    ("", ""),
])
def test_an_endpoint_is_said_with_its_user_info_masked(url, said):
    assert masked(url) == said


@pytest.mark.parametrize("url, info, bare", [
    ("http://user:s3cret@host:4318/v1/traces", "user:s3cret", "http://host:4318/v1/traces"),
    ("user:s3cret@host:4317", "user:s3cret", "host:4317"),
    ("http://host:4318/a@b", "", "http://host:4318/a@b"),
    ("http://a:b@c@host", "a:b@c", "http://host"),
])
def test_user_info_is_taken_from_the_authority_only(url, info, bare):
    assert (userinfo(url), without_userinfo(url)) == (info, bare)


@pytest.mark.parametrize("url, pair", [
    ("http://user:s3cret@host", b"user:s3cret"),
    ("http://us%40er:p%3Ass@host", b"us@er:p:ss"),
    ("http://token:@host", b"token:"),
    ("http://j%C3%BCrgen:pw@host", "jürgen:pw".encode("latin-1")),
])
def test_user_info_with_a_password_makes_basic_credentials(url, pair):
    assert basic_authorization(url) == "Basic " + base64.b64encode(pair).decode()


@pytest.mark.parametrize("url", ["http://host:4318", "http://t0ken@host:4318"])
def test_no_basic_credentials_without_a_password(url):
    assert basic_authorization(url) is None


@pytest.mark.parametrize("protocol, expected", [
    ("grpc", "http://c:4317/"), ("http/protobuf", "http://c:4317/v1/metrics")])
def test_the_generic_endpoint_gets_the_signals_path_over_http_only(protocol, expected):
    environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317/"}
    assert configured_endpoint(environ, "METRICS", protocol) == expected

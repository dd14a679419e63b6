"""Every form of ``OTEL_EXPORTER_OTLP_[<SIGNAL>_]ENDPOINT`` comes to the same place in
the package's senders as in the SDK's own exporters, built from the same variables:
the gRPC target and TLS, the HTTP URL and the Basic credentials of its user info.
The forms that cannot work are refused with one line that names the variable and
says no password. Pure (channels are made, nothing is sent) but for one send that
shows a gRPC endpoint without a scheme reaching its host."""
from __future__ import annotations

import pytest
import requests
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
    OTLPMetricExporter as HttpMetricExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)

from dask_otel_spans.otelenv import ConfigurationError, check_environ
from dask_otel_spans.otlpendpoint import without_userinfo
from dask_otel_spans.sdk.otlp import otlp_exporter_kwargs
from dask_otel_spans.sdk.otlpsend import request_sender

GRPC_FORMS = {
    "http URL": {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"},
    "https URL": {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://collector:4317"},
    "no scheme": {"OTEL_EXPORTER_OTLP_ENDPOINT": "otel-collector:4317"},
    "no scheme, insecure": {"OTEL_EXPORTER_OTLP_ENDPOINT": "otel-collector:4317",
                            "OTEL_EXPORTER_OTLP_INSECURE": "true"},
    "no scheme, signal's insecure": {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "otel-collector:4317",
        "OTEL_EXPORTER_OTLP_TRACES_INSECURE": "true"},
    "http URL, insecure false": {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317",
                                 "OTEL_EXPORTER_OTLP_INSECURE": "false"},
    "https URL, insecure": {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://collector:4317",
                            "OTEL_EXPORTER_OTLP_INSECURE": "true"},
    "localhost, no scheme": {"OTEL_EXPORTER_OTLP_ENDPOINT": "localhost:4317"},
    "IPv4, no scheme": {"OTEL_EXPORTER_OTLP_ENDPOINT": "10.0.0.7:4317"},
    "IPv6 literal": {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://[::1]:4317"},
    "IPv6, no scheme": {"OTEL_EXPORTER_OTLP_ENDPOINT": "[::1]:4317"},
    "with path": {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317/otlp"},
    "trailing slash": {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317/"},
    "dns resolver": {"OTEL_EXPORTER_OTLP_ENDPOINT": "dns:///collector:4317"},
    "unix socket": {"OTEL_EXPORTER_OTLP_ENDPOINT": "unix:///run/otel/otlp.sock"},
    "signal's own": {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://generic:4317",
                     "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "traces-only:4317"},
    "unset": {},
}

HTTP_FORMS = {
    "generic": {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"},
    "generic, trailing slash": {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"},
    "generic, with path": {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://gw.example/otlp"},
    "generic, path and slash": {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://gw.example/otlp/"},
    "signal's own, as it is": {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://generic:4318",
                               "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT":
                                   "http://collector:4318/custom"},
    "signal's own, trailing slash": {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT":
                                         "http://collector:4318/v1/traces/"},
    "IPv6 literal": {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://[::1]:4318"},
    "upper-case scheme": {"OTEL_EXPORTER_OTLP_ENDPOINT": "HTTP://collector:4318"},
    "user info": {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://user:pa55@collector:4318"},
    "user info, encoded": {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT":
                               "https://us%40er:p%3Ass%20w@collector/v1/traces"},
    "user info, empty password": {"OTEL_EXPORTER_OTLP_ENDPOINT":
                                      "http://token:@collector:4318"},
    "user without password": {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://user@collector:4318"},
    "user info and a header": {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://u:p@collector:4318",
                               "OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer%20x"},
    "unset": {},
}


@pytest.fixture
def env(monkeypatch):
    """Set variables for the SDK's exporters (they read ``os.environ``) and return
    them for the package's."""
    for name in list(__import__("os").environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)

    def set_(variables: dict[str, str], protocol: str) -> dict[str, str]:
        variables = {**variables, "OTEL_EXPORTER_OTLP_PROTOCOL": protocol}
        for name, value in variables.items():
            monkeypatch.setenv(name, value)
        return variables

    return set_


@pytest.mark.parametrize("form", GRPC_FORMS)
def test_a_grpc_endpoint_comes_to_the_sdk_exporters_target_and_tls(form, env):
    environ = env(GRPC_FORMS[form], "grpc")
    sdk = GrpcSpanExporter()
    sender = request_sender(environ, "traces")
    try:
        assert (sender.target, sender.insecure) == (sdk._endpoint, _sdk_insecure(sdk))
    finally:
        sdk.shutdown()
        sender.close()


def test_a_grpc_endpoint_without_a_scheme_reaches_its_host(otlp_receiver):
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"localhost:{otlp_receiver.port}",
               "OTEL_EXPORTER_OTLP_INSECURE": "true", "OTEL_EXPORTER_OTLP_TIMEOUT": "5"}
    sender = request_sender(environ, "traces")
    request = ExportTraceServiceRequest(resource_spans=[{"scope_spans": [{"spans": [
        {"trace_id": b"\1" * 16, "span_id": b"\2" * 8, "name": "no scheme"}]}]}])
    try:
        assert sender.send(request.SerializeToString()).delivered
    finally:
        sender.close()
    assert [s["name"] for s in otlp_receiver.spans()] == ["no scheme"]


def _sdk_insecure(exporter) -> bool:
    """Whether the SDK's gRPC exporter opened a plain-text channel (said by an
    attribute since 1.39; before, it kept credentials for a TLS one only)."""
    if hasattr(exporter, "_insecure"):
        return exporter._insecure
    return not hasattr(exporter, "_credentials")


def _sdk_session(exporter) -> requests.Session:
    """The requests session of the SDK's OTLP/HTTP exporter (its own before 1.39,
    its transport's since)."""
    return getattr(exporter, "_session", None) or exporter._client._transport._session


def _sdk_headers(exporter) -> dict[str, str]:
    return getattr(exporter, "_client", exporter)._headers


def _requests_would_send(exporter) -> requests.PreparedRequest:
    """The request the SDK's OTLP/HTTP exporter's session prepares for its endpoint
    (URL and Authorization as requests takes them from the user info)."""
    session = _sdk_session(exporter)
    session.trust_env = False  # (no ~/.netrc in the way)
    return session.prepare_request(requests.Request("POST", exporter._endpoint))


@pytest.mark.parametrize("form", HTTP_FORMS)
def test_an_http_endpoint_comes_to_the_sdk_exporters_url_and_credentials(form, env):
    environ = env(HTTP_FORMS[form], "http/protobuf")
    sdk = HttpSpanExporter()
    prepared = _requests_would_send(sdk)
    sender = request_sender(environ, "traces")
    headers = otlp_exporter_kwargs(environ, "TRACES", "http/protobuf").get("headers", {})
    try:
        assert sender.url == without_userinfo(sdk._endpoint)
        ours = requests.PreparedRequest()
        ours.prepare_url(sender.url, None)
        assert ours.url == without_userinfo(prepared.url)
        if "Authorization" in prepared.headers:  # (requests: the user info wins)
            assert headers["authorization"] == prepared.headers["Authorization"]
        else:
            assert headers.get("authorization") == _sdk_headers(sdk).get("authorization")
    finally:
        sdk.shutdown()


@pytest.mark.parametrize("form", ["generic", "generic, with path", "signal's own, as it is"])
def test_each_signal_of_an_http_endpoint_goes_to_its_path_as_in_the_sdk(form, env):
    environ = env(HTTP_FORMS[form], "http/protobuf")
    sdk = HttpMetricExporter()
    try:
        assert request_sender(environ, "metrics").url == sdk._endpoint
    finally:
        sdk.shutdown()


@pytest.mark.parametrize("protocol, endpoint, said", [
    ("grpc", "http://user:pa55word@collector:4317", "user info"),
    ("grpc", "user:pa55word@collector:4317", "user info"),
    ("http/protobuf", "collector:4318", "http:// or https://"),
    ("http/protobuf", "ftp://user:pa55word@collector/", "http:// or https://"),
    ("http/protobuf", "http://user:pa55word@collector:port/", "not a URL"),
    ("grpc", "http://[::1:4317", "not a URL"),
])
def test_an_endpoint_that_cannot_work_is_refused_naming_its_variable_without_secret(
        protocol, endpoint, said):
    environ = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
               "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint}
    for check in (lambda: check_environ(environ),
                  lambda: request_sender(environ, "traces")):
        with pytest.raises(ConfigurationError) as e:
            check()
        assert "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=" in str(e.value)
        assert said in str(e.value)
        assert "pa55word" not in str(e.value)

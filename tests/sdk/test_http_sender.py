"""The OTLP/HTTP sender against loopback servers: a request counts as delivered only
when the configured endpoint itself answered it 2xx; a redirect is not followed (the
API key would go along, to a host nobody configured) and what it carried stays held;
a URL's user info goes as Basic authentication, to the host."""
from __future__ import annotations

import base64
import logging

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from support.polling import wait_for
from support.receivers import AnsweringHTTPServer, OTLPHttpReceiver

from dask_otel_spans.sdk.delivery import Delivery
from dask_otel_spans.sdk.destination import destination_of
from dask_otel_spans.sdk.health import ExportHealth
from dask_otel_spans.sdk.otlpsend import request_sender
from dask_otel_spans.sdk.spool import Spool

#: An encoded trace request of one span
PAYLOAD = ExportTraceServiceRequest(resource_spans=[{"scope_spans": [{"spans": [
    {"trace_id": b"\1" * 16, "span_id": b"\2" * 8, "name": "s"}]}]}]).SerializeToString()
API_KEY = "api-key-SECRET-1234"


def http_environ(endpoint: str) -> dict[str, str]:
    return {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_EXPORTER_OTLP_HEADERS": f"api-key={API_KEY}",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "2"}


@pytest.fixture
def elsewhere():
    """A server nobody configured, which takes anything: where redirects point."""
    with AnsweringHTTPServer(200) as server:
        yield server


@pytest.fixture
def delivery(tmp_path):
    """A started delivery (in memory) whose traces :func:`http_environ` configures:
    ``start(endpoint)`` -> (delivery, health)."""
    started = []

    def start(endpoint: str) -> tuple[Delivery, ExportHealth]:
        delivery = Delivery(Spool(str(tmp_path), 10**6, 10**7))
        health = ExportHealth("traces", "the test's endpoint")
        delivery.add_destination(destination_of(http_environ(endpoint), "traces"),
                                 request_sender(http_environ(endpoint), "traces"),
                                 health)
        delivery.start()
        started.append(delivery)
        return delivery, health

    yield start
    for d in started:
        d.close(0.0)


@pytest.mark.parametrize("status", [302, 308])
def test_a_redirect_is_not_followed_and_what_it_carried_stays_held(
        status, elsewhere, delivery, caplog):
    location = f"{elsewhere.url}/v1/traces"
    with AnsweringHTTPServer(status, {"Location": location}) as redirector:
        sending, health = delivery(redirector.url)
        sending.hold("traces", PAYLOAD, 1)
        # (tried again after its backoff: held, not dropped)
        wait_for(lambda: len(redirector.requests) >= 2, timeout=10)
        figures = sending.figures("traces", health.delivered, health.failed)
    assert elsewhere.requests == []
    assert redirector.requests[0][2]["api-key"] == API_KEY  # (it went to the endpoint)
    assert (health.delivered, health.failed, figures.waiting) == (0, 0, 1)
    assert not sending.drain(0.0)
    said = [r for r in caplog.records if "redirects are not followed" in r.getMessage()]
    assert len(said) == 1
    assert said[0].levelno == logging.ERROR and location in said[0].getMessage()


def test_a_redirects_location_is_said_without_its_password(delivery, caplog):
    with AnsweringHTTPServer(307, {"Location": "http://u:hunter2@other:4318/"}) as server:
        sending, _ = delivery(server.url)
        sending.hold("traces", PAYLOAD, 1)
        wait_for(lambda: "redirects are not followed" in caplog.text, timeout=10)
    assert "http://u:***@other:4318/" in caplog.text
    assert "hunter2" not in caplog.text


@pytest.mark.parametrize("status, delivered, retryable", [
    (200, True, False),
    (202, True, False),
    (204, True, False),
    (103, False, False),
    (300, False, True),
    (304, False, True),
    (400, False, False),
    (404, False, False),
    (500, False, False),
    (503, False, True),
])
def test_only_a_2xx_answer_of_the_endpoint_counts_as_delivered(
        status, delivered, retryable):
    with AnsweringHTTPServer(status) as server:
        sender = request_sender(http_environ(server.url), "traces")
        reply = sender.send(PAYLOAD)
    assert (reply.delivered, reply.retryable) == (delivered, retryable)
    assert len(server.requests) == 1


def test_user_info_goes_to_the_host_as_basic_authentication(tmp_path):
    receiver = OTLPHttpReceiver().start()
    try:
        endpoint = f"http://ann%40team:pa%3Ass@127.0.0.1:{receiver.port}"
        reply = request_sender(http_environ(endpoint), "traces").send(PAYLOAD)
    finally:
        receiver.stop()
    assert reply.delivered
    assert len(receiver.spans()) == 1
    expected = base64.b64encode(b"ann@team:pa:ss").decode()
    assert receiver.headers[0]["authorization"] == f"Basic {expected}"
    assert receiver.headers[0]["api-key"] == API_KEY


def test_the_sdks_exporter_as_the_package_builds_it_follows_no_redirect(elsewhere):
    """(the workers' exporters: a 3xx is a failed export, not a success)"""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExportResult

    from dask_otel_spans.sdk.otlp import RedirectNotFollowed, otlp_exporter

    span = TracerProvider().get_tracer("test").start_span("s")
    span.end()
    result = None
    with AnsweringHTTPServer(302, {"Location": f"{elsewhere.url}/v1/traces"}
                             ) as redirector:
        exporter, _ = otlp_exporter(http_environ(redirector.url), "TRACES")
        try:
            result = exporter.export([span])
        except RedirectNotFollowed:  # (SDK 1.38: raised to the span processor, which
            pass                     # logs it)
        finally:
            exporter.shutdown()
    assert result in (None, SpanExportResult.FAILURE)
    assert len(redirector.requests) == 1 and redirector.requests[0][2]["api-key"] == API_KEY
    assert elsewhere.requests == []

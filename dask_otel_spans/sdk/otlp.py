"""OTLP exporters (traces, metrics, logs) from the standard
``OTEL_EXPORTER_OTLP_[<SIGNAL>_]*`` variables: endpoint, protocol, headers, timeout,
compression, TLS (the checks that say which value cannot work are
:mod:`dask_otel_spans.otelenv`'s)."""
from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal, TypedDict, overload
from urllib.parse import unquote

from dask_otel_spans.logonce import OnceLogger
from dask_otel_spans.otelenv import (
    OTLP_COMPRESSIONS,
    ConfigurationError,
    check_endpoint,
    otlp_protocol,
    signal_setting,
)
from dask_otel_spans.otlpendpoint import (
    basic_authorization,
    configured_endpoint,
    default_endpoint,
    masked,
    without_userinfo,
)

if TYPE_CHECKING:
    import grpc
    import requests
    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.sdk._logs.export import LogRecordExporter
    from opentelemetry.sdk.metrics.export import MetricExporter
    from opentelemetry.sdk.trace.export import SpanExporter

logger = logging.getLogger(__name__)
#: (each signal's exporter reads the headers: a malformed one is said once)
_log_once = OnceLogger(logger)


class _HeaderTextHidden(logging.Filter):
    """Keeps the text of a malformed header out of the SDK's warning about it (the
    OTLP/HTTP exporters read the headers variable again, whatever they are given):
    a header is where API keys go."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.args:
            record.args = ("(not shown: it may hold a secret)",) * len(record.args)
        return True


#: The SDK's logger that says a malformed header with its text
SDK_HEADERS_LOGGER = "opentelemetry.util.re"
_HIDE_HEADER_TEXT = _HeaderTextHidden()


class GivenHeaders(dict):
    """Headers read from a variable that was set: true even when empty (every item
    malformed), so that the SDK's exporter, which reads the variable again for
    headers that are not given (``headers or ...``), does not (and warns again)."""

    def __bool__(self) -> bool:
        return True


def parse_headers(value: str | None) -> dict[str, str]:
    """``OTEL_EXPORTER_OTLP_HEADERS`` format: ``k1=v1,k2=v2``, URL-encoded values."""
    out: dict[str, str] = GivenHeaders() if value else {}
    for item in (value or "").split(","):
        key, sep, val = item.partition("=")
        if sep and key.strip():
            out[unquote(key.strip()).lower()] = unquote(val.strip())
        elif item.strip():
            # (its text is not said: a header is where API keys go)
            _log_once(f"header:{item}", "ignoring a malformed OTLP header (expected "
                      "key=value, comma-separated; not shown: it may hold a secret)")
    return out


#: gRPC channel options of the OTLP exporters: reconnect to a collector that came
#: back within seconds
GRPC_CHANNEL_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 500),
    ("grpc.max_reconnect_backoff_ms", 5000),
)


class OTLPExporterKwargs(TypedDict, total=False):
    """Keyword arguments of the SDK's OTLP exporters (:func:`otlp_exporter_kwargs`),
    and those of :mod:`~dask_otel_spans.sdk.otlpsend`'s senders."""

    endpoint: str
    headers: dict[str, str]
    #: seconds
    timeout: float
    compression: grpc.Compression | Compression
    # gRPC only
    channel_options: tuple[tuple[str, int], ...]
    insecure: bool
    credentials: grpc.ChannelCredentials
    # HTTP only (the client key and chain: the senders' only)
    certificate_file: str
    client_key_file: str
    client_certificate_file: str


def _endpoint_kwargs(environ: Mapping[str, str], signal: str, protocol: str
                     ) -> OTLPExporterKwargs:
    """The endpoint and headers of the OTLP exporter of ``signal`` (checked)."""
    check_endpoint(environ, signal, protocol)
    kwargs: OTLPExporterKwargs = {}
    endpoint = configured_endpoint(environ, signal, protocol)
    if endpoint:
        kwargs["endpoint"] = endpoint
    headers = signal_setting(environ, signal, "HEADERS")
    if headers:
        kwargs["headers"] = parse_headers(headers)
    if endpoint and protocol == "http/protobuf":
        # (as the SDK's exporter through requests: user info with a password goes
        # as Basic authentication, over an Authorization header; the URL without it)
        kwargs["endpoint"] = without_userinfo(endpoint)
        authorization = basic_authorization(endpoint)
        if authorization:
            kwargs["headers"] = GivenHeaders(kwargs.get("headers") or {},
                                             authorization=authorization)
    return kwargs


def otlp_exporter_kwargs(
    environ: Mapping[str, str], signal: str, protocol: str
) -> OTLPExporterKwargs:
    """Keyword arguments of the OTLP exporter of ``signal`` (``TRACES``, ``METRICS``
    or ``LOGS``) from the standard variables in ``environ``; unset ones are left out
    so that the exporter's own defaults apply."""
    kwargs = _endpoint_kwargs(environ, signal, protocol)
    timeout = signal_setting(environ, signal, "TIMEOUT")
    if timeout:
        # The Python exporters read this variable in seconds; so do we.
        kwargs["timeout"] = float(timeout)
    compression = signal_setting(environ, signal, "COMPRESSION")
    if compression:
        kwargs["compression"] = _compression(compression.strip().lower(), protocol)
    certificate = signal_setting(environ, signal, "CERTIFICATE")
    if protocol == "grpc":
        # gRPC's default reconnect backoff grows to 120 s: after a collector outage
        # the exporter would stay away long after the collector is back.
        kwargs["channel_options"] = GRPC_CHANNEL_OPTIONS
        insecure = signal_setting(environ, signal, "INSECURE")
        if insecure:
            kwargs["insecure"] = insecure.strip().lower() == "true"
        if certificate:
            import grpc

            with open(certificate, "rb") as f:
                kwargs["credentials"] = grpc.ssl_channel_credentials(f.read())
    elif certificate:
        kwargs["certificate_file"] = certificate
    return kwargs


#: signal -> (class, module) of its OTLP exporter, in the gRPC and the HTTP package
_OTLP_EXPORTERS = {
    "TRACES": ("OTLPSpanExporter", "trace_exporter"),
    "METRICS": ("OTLPMetricExporter", "metric_exporter"),
    "LOGS": ("OTLPLogExporter", "_log_exporter"),
}


@overload
def otlp_exporter(environ: Mapping[str, str],
                  signal: Literal["TRACES"]) -> tuple[SpanExporter, str]: ...
@overload
def otlp_exporter(environ: Mapping[str, str],
                  signal: Literal["METRICS"]) -> tuple[MetricExporter, str]: ...
@overload
def otlp_exporter(environ: Mapping[str, str],
                  signal: Literal["LOGS"]) -> tuple[LogRecordExporter, str]: ...
def otlp_exporter(
    environ: Mapping[str, str], signal: str
) -> tuple[SpanExporter | MetricExporter | LogRecordExporter, str]:
    """The OTLP exporter of ``signal`` (``TRACES``, ``METRICS``, ``LOGS``) over the
    configured protocol, and where it sends, in words."""
    protocol = otlp_protocol(environ, signal)
    kwargs = otlp_exporter_kwargs(environ, signal, protocol)
    cls, module = _OTLP_EXPORTERS[signal]
    logging.getLogger(SDK_HEADERS_LOGGER).addFilter(_HIDE_HEADER_TEXT)
    package = "grpc" if protocol == "grpc" else "http"
    extra = ({"session": no_redirect_session()}
             if package == "http" and not _credential_provider(environ, signal) else {})
    exporter = getattr(importlib.import_module(
        f"opentelemetry.exporter.otlp.proto.{package}.{module}"), cls)(**kwargs, **extra)
    return exporter, said_destination(environ, signal, protocol)


class RedirectNotFollowed(Exception):
    """An OTLP/HTTP endpoint answered a redirect, which is not followed."""


def _refuse_redirect(response: requests.Response, *args: object, **kwargs: object
                     ) -> None:
    if 300 <= response.status_code < 400:
        location = masked(response.headers.get("Location") or "nowhere")
        raise RedirectNotFollowed(
            f"HTTP {response.status_code} to {location}: redirects are not followed "
            "(the headers would go along)")


def no_redirect_session() -> requests.Session:
    """A ``requests`` session for the SDK's OTLP/HTTP exporters that takes a 3xx
    as a failed export: not followed (requests' default for a POST, which some SDK
    releases keep, follows it with the headers), nor counted a success (as the
    SDK's exporter that does not follow it counts it)."""
    import requests

    session = requests.Session()
    session.hooks["response"].append(_refuse_redirect)
    return session


def _credential_provider(environ: Mapping[str, str], signal: str) -> bool:
    """Whether a credential provider gives the SDK's OTLP/HTTP exporter of
    ``signal`` its session (which is then left as it is)."""
    names = ("OTEL_PYTHON_EXPORTER_OTLP_HTTP_CREDENTIAL_PROVIDER",
             f"OTEL_PYTHON_EXPORTER_OTLP_HTTP_{signal}_CREDENTIAL_PROVIDER")
    return any(environ.get(n) or os.environ.get(n) for n in names)


def said_destination(environ: Mapping[str, str], signal: str, protocol: str) -> str:
    """Where the OTLP exporter of ``signal`` sends, in words: its protocol and its
    endpoint, user info masked."""
    where = configured_endpoint(environ, signal, protocol) or default_endpoint(
        protocol, signal)
    return f"OTLP {protocol} to {masked(where)}"


def _compression(value: str, protocol: str) -> grpc.Compression | Compression:
    if value not in OTLP_COMPRESSIONS:
        raise ConfigurationError(
            f"OTLP compression {value!r} is not one of {', '.join(OTLP_COMPRESSIONS)}"
        )
    if protocol == "grpc":
        import grpc

        return {
            "gzip": grpc.Compression.Gzip,
            "deflate": grpc.Compression.Deflate,
            "none": grpc.Compression.NoCompression,
        }[value]
    from opentelemetry.exporter.otlp.proto.http import Compression

    return {
        "gzip": Compression.Gzip,
        "deflate": Compression.Deflate,
        "none": Compression.NoCompression,
    }[value]

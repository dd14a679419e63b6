"""OTLP exporters (traces, metrics, logs) from the standard
``OTEL_EXPORTER_OTLP_[<SIGNAL>_]*`` variables: endpoint, protocol, headers, timeout,
compression, TLS (the checks that say which value cannot work are
:mod:`dask_otel_spans.otelenv`'s)."""
from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal, TypedDict, overload
from urllib.parse import unquote

from dask_otel_spans.logonce import OnceLogger
from dask_otel_spans.otelenv import (
    OTLP_COMPRESSIONS,
    ConfigurationError,
    otlp_protocol,
    signal_setting,
)

if TYPE_CHECKING:
    import grpc
    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.sdk._logs.export import LogRecordExporter
    from opentelemetry.sdk.metrics.export import MetricExporter
    from opentelemetry.sdk.trace.export import SpanExporter

logger = logging.getLogger(__name__)
#: (each signal's exporter reads the headers: a malformed one is said once)
_log_once = OnceLogger(logger)


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
            _log_once(f"header:{item}", "ignoring malformed OTLP header %r (expected "
                      "key=value, comma-separated)", item)
    return out


#: gRPC channel options of the OTLP exporters: reconnect to a collector that came
#: back within seconds
GRPC_CHANNEL_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 500),
    ("grpc.max_reconnect_backoff_ms", 5000),
)


def _endpoint(environ: Mapping[str, str], signal: str, protocol: str) -> str | None:
    """The signal's endpoint variable, else the generic one (for ``http/protobuf``
    with the signal's path appended); None when neither is set."""
    specific = environ.get(f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT")
    if specific:
        return specific
    generic = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if generic and protocol == "http/protobuf":
        path = {"TRACES": "v1/traces", "METRICS": "v1/metrics", "LOGS": "v1/logs"}[signal]
        return generic.rstrip("/") + "/" + path
    return generic or None


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


def default_endpoint(protocol: str, signal: str) -> str:
    """Where the OTLP exporter of ``signal`` (``TRACES``, ``METRICS``, ``LOGS``)
    sends with no endpoint configured: the OTLP specification's (and the SDK
    exporters') default for ``protocol``."""
    if protocol == "grpc":
        return "http://localhost:4317"
    return f"http://localhost:4318/v1/{signal.lower()}"


def otlp_exporter_kwargs(
    environ: Mapping[str, str], signal: str, protocol: str
) -> OTLPExporterKwargs:
    """Keyword arguments of the OTLP exporter of ``signal`` (``TRACES``, ``METRICS``
    or ``LOGS``) from the standard variables in ``environ``; unset ones are left out
    so that the exporter's own defaults apply."""
    kwargs: OTLPExporterKwargs = {}
    endpoint = _endpoint(environ, signal, protocol)
    if endpoint:
        kwargs["endpoint"] = endpoint
    headers = signal_setting(environ, signal, "HEADERS")
    if headers:
        kwargs["headers"] = parse_headers(headers)
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
    package = "grpc" if protocol == "grpc" else "http"
    exporter = getattr(importlib.import_module(
        f"opentelemetry.exporter.otlp.proto.{package}.{module}"), cls)(**kwargs)
    where = kwargs.get("endpoint") or default_endpoint(protocol, signal)
    return exporter, f"OTLP {protocol} to {where}"


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

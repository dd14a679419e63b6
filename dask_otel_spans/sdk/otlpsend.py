"""Send an encoded OTLP request (the protobuf bytes of an ``Export*ServiceRequest``)
as it is, byte for byte, over gRPC or http/protobuf, once, and say what the receiver
answered: delivered, worth another try (and after how long, when the server said),
or refused for good. Built from the same ``OTEL_EXPORTER_OTLP_*`` variables as the
SDK's exporters (:func:`~dask_otel_spans.sdk.otlp.otlp_exporter_kwargs`)."""
from __future__ import annotations

import gzip
import http.client
import logging
import ssl
import urllib.error
import urllib.request
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from email.message import Message
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Protocol

from dask_otel_spans.logonce import OnceLogger
from dask_otel_spans.otelenv import otlp_protocol
from dask_otel_spans.otlpendpoint import (
    default_endpoint,
    grpc_insecure,
    grpc_target,
    masked,
)
from dask_otel_spans.sdk.otlp import (
    OTLPExporterKwargs,
    otlp_exporter_kwargs,
    said_destination,
)

if TYPE_CHECKING:
    import grpc

logger = logging.getLogger(__name__)
#: (a redirect is said once per place it points to)
_log_once = OnceLogger(logger)

#: signal -> the gRPC method of its OTLP service
GRPC_METHODS = {
    "traces": "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
    "metrics": "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
    "logs": "/opentelemetry.proto.collector.logs.v1.LogsService/Export",
    "profiles": "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export",
}
#: gRPC status codes worth another try (OTLP specification)
GRPC_RETRYABLE = frozenset({
    "CANCELLED", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "ABORTED", "OUT_OF_RANGE",
    "UNAVAILABLE", "DATA_LOSS",
})
#: gRPC status codes of a request that went out and got no answer: the deadline
#: passed (the receiver may have taken it)
GRPC_UNANSWERED = frozenset({"DEADLINE_EXCEEDED"})
#: HTTP statuses worth another try (OTLP specification); a redirect (3xx), not
#: followed, is held too (:class:`HttpRequestSender`)
HTTP_RETRYABLE = frozenset({429, 502, 503, 504})
#: gRPC channel options of the sender, over the exporters' ones
GRPC_RECONNECT = {"grpc.initial_reconnect_backoff_ms": 250,
                  "grpc.max_reconnect_backoff_ms": 1000}
#: The SDK exporters' timeout when ``OTEL_EXPORTER_OTLP_[<SIGNAL>_]TIMEOUT`` is unset
DEFAULT_TIMEOUT = 10.0


@dataclass(frozen=True)
class Reply:
    """What one send of a request came to.

    Attributes
    ----------
    delivered:
        The receiver acknowledged the request
    retryable:
        Not delivered, and worth another try (backend away, overloaded)
    retry_after:
        Seconds the server asked to wait (gRPC ``RetryInfo``, HTTP ``Retry-After``);
        None when it did not say
    reason:
        In words, for the log
    unanswered:
        Not delivered for want of an answer: the request went out, and the
        exporter's timeout passed or the connection was lost before the answer came.
        The receiver may have taken it: sending it again may give it twice.
    """

    delivered: bool
    retryable: bool = False
    retry_after: float | None = None
    reason: str = ""
    unanswered: bool = False


class RequestSender(Protocol):
    """Sends one encoded request of its signal and says what came of it."""

    #: where it sends, in words
    where: str
    #: seconds a send may take, as the SDK's exporter's timeout
    timeout: float

    def send(self, payload: bytes) -> Reply: ...

    def close(self) -> None: ...


class GrpcRequestSender:
    """Sends encoded requests to an OTLP/gRPC receiver: the bytes go on the wire as
    they are (no serializer)."""

    def __init__(self, signal: str, kwargs: OTLPExporterKwargs, where: str | None = None):
        import grpc

        endpoint = kwargs.get("endpoint") or default_endpoint("grpc", signal)
        #: the channel's target, and whether it is plain text, as the SDK's exporter
        #: reads the endpoint (host:port of a URL, else the endpoint as written:
        #: otel-collector:4317)
        self.target = grpc_target(endpoint)
        self.insecure = grpc_insecure(endpoint, kwargs.get("insecure"))
        # (reconnect within a second of the receiver's return: a held backlog waits
        # on it)
        options = [*dict(kwargs.get("channel_options") or ()).items(),
                   *GRPC_RECONNECT.items()]
        options = list(dict(options).items())
        compression = kwargs.get("compression")
        if self.insecure:
            self._channel = grpc.insecure_channel(self.target, options, compression)
        else:
            credentials = kwargs.get("credentials") or grpc.ssl_channel_credentials()
            self._channel = grpc.secure_channel(self.target, credentials, options,
                                                compression)
        self._call = self._channel.unary_unary(GRPC_METHODS[signal])
        self._metadata = tuple((kwargs.get("headers") or {}).items())
        #: seconds a send may take (``OTEL_EXPORTER_OTLP_[<SIGNAL>_]TIMEOUT``)
        self.timeout = float(kwargs.get("timeout") or DEFAULT_TIMEOUT)
        #: where it sends, in words (user info masked)
        self.where = where or f"OTLP grpc to {masked(endpoint)}"

    def send(self, payload: bytes) -> Reply:
        import grpc

        try:
            self._call(payload, timeout=self.timeout, metadata=self._metadata)
        except grpc.RpcError as error:
            code = error.code() if hasattr(error, "code") else None
            name = getattr(code, "name", str(code))
            return Reply(False, name in GRPC_RETRYABLE, _retry_info(error),
                          f"gRPC {name}: {_details(error)}",
                          unanswered=name in GRPC_UNANSWERED)
        return Reply(True)

    def close(self) -> None:
        self._channel.close()


def _details(error: grpc.RpcError) -> str:
    try:
        return str(error.details())
    except Exception:
        return ""


def _retry_info(error: grpc.RpcError) -> float | None:
    """The delay of a ``google.rpc.RetryInfo`` in the error's trailing metadata."""
    try:
        raw = dict(error.trailing_metadata() or ()).get("google.rpc.retryinfo-bin")
    except Exception:
        return None
    if raw is None:
        return None
    from google.rpc.error_details_pb2 import RetryInfo

    info = RetryInfo()
    try:
        info.ParseFromString(raw)
    except Exception:
        return None
    return info.retry_delay.seconds + info.retry_delay.nanos / 1e9


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """Follows no redirect: a 3xx is answered as an error (the request, headers
    and all, goes nowhere but the configured endpoint)."""

    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


class HttpRequestSender:
    """Sends encoded requests to an OTLP/HTTP receiver (``http/protobuf``).

    A request counts as delivered only when the endpoint itself answered it 2xx:
    no redirect is followed (the headers, API keys among them, would go along, to
    a host nobody configured). A 3xx is said once with where it pointed to, and
    what it carried is held as after an outage, not dropped: a redirect is a
    misconfigured endpoint or a proxy in the way, which someone fixes (the newest
    SDK's exporter does not follow one either, and counts it a success; older ones
    follow it)."""

    def __init__(self, signal: str, kwargs: OTLPExporterKwargs, where: str | None = None):
        #: the URL requests go to (without user info: it goes as a header)
        self.url = kwargs.get("endpoint") or default_endpoint("http/protobuf", signal)
        #: where it sends, in words (user info masked)
        self.where = where or f"OTLP http/protobuf to {masked(self.url)}"
        self._headers = {"Content-Type": "application/x-protobuf",
                         **dict(kwargs.get("headers") or {})}
        compression = getattr(kwargs.get("compression"), "value", None)
        self._compression = compression if compression in ("gzip", "deflate") else None
        if self._compression:
            self._headers["Content-Encoding"] = self._compression
        #: seconds a send may take (``OTEL_EXPORTER_OTLP_[<SIGNAL>_]TIMEOUT``)
        self.timeout = float(kwargs.get("timeout") or DEFAULT_TIMEOUT)
        certificate = kwargs.get("certificate_file")
        key, chain = kwargs.get("client_key_file"), kwargs.get("client_certificate_file")
        self._context = (ssl.create_default_context(cafile=certificate)
                         if certificate or chain else None)
        if self._context is not None and chain:
            self._context.load_cert_chain(chain, key)
        self._opener = urllib.request.build_opener(
            _NoRedirects(), urllib.request.HTTPSHandler(context=self._context))

    def send(self, payload: bytes) -> Reply:
        body = payload
        if self._compression == "gzip":
            body = gzip.compress(payload)
        elif self._compression == "deflate":
            body = zlib.compress(payload)
        request = urllib.request.Request(self.url, data=body, headers=self._headers,
                                         method="POST")
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                response.read()
                if 200 <= response.status < 300:
                    return Reply(True)
                # (urllib's error processor raises for these: a guard)
                return self._refused(response.status, response.reason, response.headers)
        except urllib.error.HTTPError as e:
            with e:
                return self._refused(e.code, e.reason, e.headers)
        except urllib.error.URLError as e:  # (before the request was sent)
            return Reply(False, True, None, f"{type(e).__name__}: {e}")
        except (OSError, http.client.HTTPException) as e:
            # (urllib wraps what fails while connecting and sending in URLError:
            # this came after the request went out, waiting for the answer)
            return Reply(False, True, None, f"{type(e).__name__}: {e}",
                         unanswered=True)

    def _refused(self, code: int, reason: str, headers: Message) -> Reply:
        """The reply of a status other than 2xx."""
        if 300 <= code < 400:
            location = masked(headers.get("Location") or "nowhere")
            _log_once(
                f"redirect:{code}:{location}",
                "%s answered HTTP %d %s, to %s; redirects are not "
                "followed (the headers would go along): what it carried is held as "
                "undelivered until the endpoint answers itself (set it to the URL "
                "data should go to)", self.where, code, reason, location,
                level=logging.ERROR)
            return Reply(False, True, None, f"HTTP {code} {reason} to {location} "
                                            "(redirect not followed)")
        retryable = code in HTTP_RETRYABLE
        after = retry_after(headers.get("Retry-After")) if retryable else None
        return Reply(False, retryable, after, f"HTTP {code} {reason}")

    def close(self) -> None:
        pass


def retry_after(value: str | None) -> float | None:
    """Seconds of an HTTP ``Retry-After`` value (seconds, or an HTTP date); None
    when absent or unreadable."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        import time

        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def request_sender(environ: Mapping[str, str], signal: str) -> RequestSender:
    """The sender of ``signal``'s (``traces``, ``metrics``, ``logs``, ``profiles``) encoded
    requests to the OTLP endpoint ``environ`` configures."""
    upper = signal.upper()
    protocol = otlp_protocol(environ, upper)
    kwargs = otlp_exporter_kwargs(environ, upper, protocol).copy()
    key, chain = (environ.get(f"OTEL_EXPORTER_OTLP_{upper}_{name}")
                  or environ.get(f"OTEL_EXPORTER_OTLP_{name}")
                  for name in ("CLIENT_KEY", "CLIENT_CERTIFICATE"))
    where = said_destination(environ, upper, protocol)
    if protocol == "grpc":
        if key and chain:  # (mutual TLS)
            import grpc

            ca = (environ.get(f"OTEL_EXPORTER_OTLP_{upper}_CERTIFICATE")
                  or environ.get("OTEL_EXPORTER_OTLP_CERTIFICATE"))
            kwargs["credentials"] = grpc.ssl_channel_credentials(
                _read(ca) if ca else None, _read(key), _read(chain))
        return GrpcRequestSender(signal, kwargs, where)
    if key and chain:
        kwargs["client_key_file"], kwargs["client_certificate_file"] = key, chain
    return HttpRequestSender(signal, kwargs, where)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()

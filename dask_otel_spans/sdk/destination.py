"""Where a batch goes: a signal's OTLP destination (protocol, endpoint, and an identity
of its credentials, never the credentials), and the one way a destination is said
(user info masked)."""
from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

from dask_otel_spans import otlpendpoint
from dask_otel_spans.otelenv import otlp_protocol, signal_setting
from dask_otel_spans.otlpendpoint import MASK as MASK
from dask_otel_spans.otlpendpoint import masked as masked
from dask_otel_spans.sdk.otlp import parse_headers


def credentials_digest(headers: Mapping[str, str] | None, userinfo: str = "") -> str:
    """An identity of a destination's credentials (header names and values, the
    URL's user info): a SHA-256 digest, the same for the same credentials in any
    order, from which none can be read back."""
    digest = hashlib.sha256(b"dask-otel-spans credentials\0")
    for name, value in sorted((k.lower(), v) for k, v in (headers or {}).items()):
        digest.update(f"{name}\0{value}\0".encode())
    digest.update(f"userinfo\0{userinfo}".encode())
    return digest.hexdigest()[:32]


@dataclass(frozen=True)
class Destination:
    """Where one signal's batches go.

    Attributes
    ----------
    signal:
        ``traces``, ``metrics`` or ``logs``
    protocol:
        ``grpc`` or ``http/protobuf``
    endpoint:
        The endpoint as configured, user info included (never say it: :attr:`shown`)
    credentials:
        :func:`credentials_digest` of its headers and user info
    """

    signal: str
    protocol: str
    endpoint: str
    credentials: str

    @property
    def shown(self) -> str:
        """The endpoint as it may be said (user info masked)."""
        return masked(self.endpoint)

    @property
    def key(self) -> str:
        """A name for the destination, for files and maps: a digest of the signal,
        protocol, endpoint and credentials (the same destination, the same key)."""
        digest = hashlib.sha256(
            f"{self.signal}\0{self.protocol}\0{self.endpoint}\0{self.credentials}"
            .encode())
        return digest.hexdigest()[:16]


def destination_of(environ: Mapping[str, str], signal: str) -> Destination:
    """The destination ``environ``'s ``OTEL_EXPORTER_OTLP_*`` variables give
    ``signal`` (``traces``, ``metrics``, ``logs``): its protocol, its endpoint as
    the SDK's exporter resolves it, and the digest of its headers and user info."""
    upper = signal.upper()
    protocol = otlp_protocol(environ, upper)
    endpoint = otlpendpoint.resolved_endpoint(environ, upper, protocol)
    headers = parse_headers(signal_setting(environ, upper, "HEADERS"))
    return Destination(signal, protocol, endpoint,
                       credentials_digest(headers, otlpendpoint.userinfo(endpoint)))

"""Where a batch goes: a signal's OTLP destination (protocol, endpoint, and an identity
of its credentials, never the credentials), and the one way a destination is said
(user info masked)."""
from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property, lru_cache

from dask_otel_spans import otlpendpoint
from dask_otel_spans.otelenv import OTLP_PROTOCOLS, otlp_protocol, signal_setting
from dask_otel_spans.otlpendpoint import MASK as MASK
from dask_otel_spans.otlpendpoint import masked as masked
from dask_otel_spans.otlpendpoint import userinfo as userinfo
from dask_otel_spans.otlpendpoint import without_userinfo as without_userinfo
from dask_otel_spans.protocol.figures import SIGNALS
from dask_otel_spans.sdk.otlp import parse_headers

#: PBKDF2-HMAC-SHA256 iterations of :func:`credentials_digest`: a digest stored in a
#: spool file costs whoever guesses a password offline as much per guess (about
#: 50 ms here), once per process and set of credentials for the package
DIGEST_ITERATIONS = 100_000


def credentials_digest(headers: Mapping[str, str] | None, userinfo: str = "") -> str:
    """An identity of a destination's credentials (header names and values, the
    URL's user info): a slow salted digest (PBKDF2-HMAC-SHA256,
    :data:`DIGEST_ITERATIONS`), the same for the same credentials in any order, from
    which none can be read back and against which a guess costs what a password
    hash's does."""
    material = "".join(
        f"{name}\0{value}\0"
        for name, value in sorted((k.lower(), v) for k, v in (headers or {}).items()))
    return _slow_digest(f"{material}userinfo\0{userinfo}")


@lru_cache(maxsize=16)
def _slow_digest(material: str) -> str:
    return hashlib.pbkdf2_hmac("sha256", material.encode(),
                               b"dask-otel-spans credentials", DIGEST_ITERATIONS,
                               dklen=16).hex()


#: The longest endpoint a destination record may name (a record is read back from disk)
MAX_ENDPOINT = 2048
_DIGEST = re.compile(r"[0-9a-f]{32}")


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
        The endpoint as configured, user info included (never say it: :attr:`shown`;
        never store it: :meth:`record`); without user info when read from a record
    credentials:
        :func:`credentials_digest` of its headers and user info
    """

    signal: str
    protocol: str
    endpoint: str
    credentials: str

    @classmethod
    def of(cls, signal: str, protocol: str, endpoint: str,
           headers: Mapping[str, str] | None) -> Destination:
        """The destination of ``signal``'s batches sent over ``protocol`` to
        ``endpoint`` (its user info, if any, counts as a credential) with
        ``headers``."""
        return cls(signal, protocol, endpoint,
                   credentials_digest(headers, userinfo(endpoint)))

    @property
    def shown(self) -> str:
        """The endpoint as it may be said (user info masked)."""
        return masked(self.endpoint)

    @cached_property
    def bare(self) -> str:
        """The endpoint without its user info (as it is stored)."""
        return without_userinfo(self.endpoint)

    @cached_property
    def key(self) -> str:
        """A name for the destination, for files and maps: a digest of the signal,
        protocol, endpoint (without user info: the credentials hold it) and
        credentials; the same destination, the same key, whether configured or read
        back from its record."""
        digest = hashlib.sha256(
            f"{self.signal}\0{self.protocol}\0{self.bare}\0{self.credentials}"
            .encode())
        return digest.hexdigest()[:16]

    def same_endpoint(self, other: Destination) -> bool:
        """Whether ``other`` is the same signal, protocol and endpoint (credentials
        aside)."""
        return (self.signal, self.protocol, self.bare) == (
            other.signal, other.protocol, other.bare)

    def record(self) -> bytes:
        """What is stored of the destination: signal, protocol, endpoint without user
        info, credentials digest (no secret)."""
        return json.dumps({"signal": self.signal, "protocol": self.protocol,
                           "endpoint": self.bare, "credentials": self.credentials},
                          sort_keys=True).encode()

    @classmethod
    def from_record(cls, data: bytes) -> Destination | None:
        """The destination a :meth:`record` holds; None when ``data`` is not one
        (malformed, a field out of its bounds)."""
        try:
            fields = json.loads(data)
        except ValueError:
            return None
        if not isinstance(fields, dict) or set(fields) != {
                "signal", "protocol", "endpoint", "credentials"}:
            return None
        signal, protocol = fields["signal"], fields["protocol"]
        endpoint, credentials = fields["endpoint"], fields["credentials"]
        if (signal not in SIGNALS or protocol not in OTLP_PROTOCOLS
                or not isinstance(endpoint, str) or not isinstance(credentials, str)
                or not 0 < len(endpoint) <= MAX_ENDPOINT or not endpoint.isprintable()
                or without_userinfo(endpoint) != endpoint
                or not _DIGEST.fullmatch(credentials)):
            return None
        return cls(signal, protocol, endpoint, credentials)


def with_userinfo(url: str, info: str) -> str:
    """``url`` (without user info) with the user info ``info`` put back (empty: as
    it is)."""
    if not info:
        return url
    scheme, sep, rest = url.partition("://")
    return f"{scheme}{sep}{info}@{rest}" if sep else f"{info}@{url}"


def destination_of(environ: Mapping[str, str], signal: str) -> Destination:
    """The destination ``environ``'s ``OTEL_EXPORTER_OTLP_*`` variables give
    ``signal`` (``traces``, ``metrics``, ``logs``): its protocol, its endpoint as
    the SDK's exporter resolves it, and the digest of its headers and user info."""
    upper = signal.upper()
    protocol = otlp_protocol(environ, upper)
    endpoint = otlpendpoint.resolved_endpoint(environ, upper, protocol)
    headers = parse_headers(signal_setting(environ, upper, "HEADERS"))
    return Destination.of(signal, protocol, endpoint, headers)

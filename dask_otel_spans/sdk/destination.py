"""Where a batch goes: a signal's OTLP destination (protocol, endpoint, and an identity
of its credentials, never the credentials), and the one way a destination is said
(user info masked)."""
from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

from dask_otel_spans.otelenv import OTLP_PROTOCOLS
from dask_otel_spans.protocol.figures import SIGNALS

#: What stands for a password wherever an endpoint is said
MASK = "***"
#: The longest endpoint a destination record may name (a record is read back from disk)
MAX_ENDPOINT = 2048
_DIGEST = re.compile(r"^[0-9a-f]{32}$")
#: the end of a URL's authority (``scheme://[userinfo@]host:port``)
_AUTHORITY_END = re.compile(r"[/?#]")


def split_userinfo(url: str) -> tuple[str | None, str]:
    """``url``'s user info (None when it has none) and ``url`` without it; with or
    without a scheme (``user:pw@host:4317``)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    end = _AUTHORITY_END.search(rest)
    authority, tail = (rest[:end.start()], rest[end.start():]) if end else (rest, "")
    userinfo, at, hostport = authority.rpartition("@")
    if not at:
        return None, url
    return userinfo, f"{scheme}{sep}{hostport}{tail}"


def with_userinfo(url: str, userinfo: str | None) -> str:
    """``url`` (without user info) with ``userinfo`` put back (None: as it is)."""
    if userinfo is None:
        return url
    scheme, sep, rest = url.partition("://")
    return f"{scheme}{sep}{userinfo}@{rest}" if sep else f"{userinfo}@{url}"


def masked(url: str) -> str:
    """``url`` as it may be said: a password in its user info replaced by
    :data:`MASK` (``http://user:***@host:4318``); anything else as it is."""
    userinfo, bare = split_userinfo(url)
    if userinfo is None:
        return url
    user, colon, _ = userinfo.partition(":")
    return with_userinfo(bare, f"{user}:{MASK}" if colon else user)


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
        userinfo, _ = split_userinfo(endpoint)
        return cls(signal, protocol, endpoint, credentials_digest(headers, userinfo or ""))

    @property
    def shown(self) -> str:
        """The endpoint as it may be said (user info masked)."""
        return masked(self.endpoint)

    @cached_property
    def bare(self) -> str:
        """The endpoint without its user info (as it is stored)."""
        return split_userinfo(self.endpoint)[1]

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
                or split_userinfo(endpoint)[0] is not None
                or not _DIGEST.match(credentials)):
            return None
        return cls(signal, protocol, endpoint, credentials)


def destination_of(environ: Mapping[str, str], signal: str) -> Destination:
    """The destination the ``OTEL_EXPORTER_OTLP_*`` variables in ``environ`` give
    ``signal``'s OTLP exporter (the one its request sender sends to)."""
    # (imported here: the exporters' module says destinations too)
    from dask_otel_spans.otelenv import otlp_protocol
    from dask_otel_spans.sdk.otlp import default_endpoint, otlp_exporter_kwargs

    upper = signal.upper()
    protocol = otlp_protocol(environ, upper)
    kwargs = otlp_exporter_kwargs(environ, upper, protocol)
    endpoint = kwargs.get("endpoint") or default_endpoint(protocol, upper)
    return Destination.of(signal, protocol, endpoint, kwargs.get("headers"))

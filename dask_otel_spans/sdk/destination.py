"""Where a batch goes: a signal's OTLP destination (protocol, endpoint, and an identity
of its credentials, never the credentials), and the one way a destination is said
(user info masked)."""
from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

#: What stands for a password wherever an endpoint is said
MASK = "***"


def masked(url: str) -> str:
    """``url`` as it may be said: a password in its user info replaced by
    :data:`MASK` (``http://user:***@host:4318``); anything else as it is."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return MASK if "@" in url else url
    if "@" not in parts.netloc:
        return url
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, sep, _ = userinfo.partition(":")
    netloc = f"{user}:{MASK}@{hostport}" if sep else f"{user}@{hostport}"
    return urlunsplit(parts._replace(netloc=netloc))


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

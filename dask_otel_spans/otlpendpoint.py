"""An OTLP endpoint (``OTEL_EXPORTER_OTLP_[<SIGNAL>_]ENDPOINT``) as the SDK's exporters
read it: which variable gives it, the gRPC target or HTTP URL it comes to, the Basic
credentials its user info carries, what cannot work, and the one way it is said (user
info masked). Standard library only: read before the SDK is imported."""
from __future__ import annotations

import base64
from collections.abc import Mapping
from urllib.parse import unquote, urlsplit

#: What stands for a password (or a lone user name) wherever an endpoint is said
MASK = "***"
#: signal -> the path the generic endpoint gets for ``http/protobuf``
SIGNAL_PATHS = {"TRACES": "v1/traces", "METRICS": "v1/metrics", "LOGS": "v1/logs",
                # (the profiles signal, development status: the Collector's path)
                "PROFILES": "v1development/profiles"}
#: The OTLP specification's (and the SDK exporters') endpoints when none is set
DEFAULT_GRPC_ENDPOINT = "http://localhost:4317"
DEFAULT_HTTP_ENDPOINT = "http://localhost:4318"
#: URL schemes an OTLP/HTTP endpoint may have
HTTP_SCHEMES = ("http", "https")


def endpoint_variable(environ: Mapping[str, str], signal: str) -> str | None:
    """Which variable gives ``signal``'s (``TRACES``, ``METRICS``, ``LOGS``)
    endpoint: the signal's own, else the generic one; None when neither is set."""
    for variable in (f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        if environ.get(variable):
            return variable
    return None


def configured_endpoint(environ: Mapping[str, str], signal: str, protocol: str
                        ) -> str | None:
    """``signal``'s endpoint as the SDK's exporter resolves it: the signal's variable
    as it is, else the generic one (for ``http/protobuf`` with the signal's path
    appended after one trailing slash is dropped); None when neither is set."""
    variable = endpoint_variable(environ, signal)
    if variable is None:
        return None
    value = environ[variable]
    if variable == "OTEL_EXPORTER_OTLP_ENDPOINT" and protocol == "http/protobuf":
        return f"{value.removesuffix('/')}/{SIGNAL_PATHS[signal]}"
    return value


def default_endpoint(protocol: str, signal: str) -> str:
    """Where the OTLP exporter of ``signal`` (``TRACES``, ``METRICS``, ``LOGS``)
    sends with no endpoint configured: the OTLP specification's (and the SDK
    exporters') default for ``protocol``."""
    if protocol == "grpc":
        return DEFAULT_GRPC_ENDPOINT
    return f"{DEFAULT_HTTP_ENDPOINT}/{SIGNAL_PATHS[signal.upper()]}"


def resolved_endpoint(environ: Mapping[str, str], signal: str, protocol: str) -> str:
    """``signal``'s endpoint: the configured one, else the default."""
    return (configured_endpoint(environ, signal, protocol)
            or default_endpoint(protocol, signal))


def _authority(url: str) -> tuple[int, int]:
    """Where the authority (``[user[:password]@]host[:port]``) of ``url`` is: after
    ``scheme://`` or ``//``, else from the start (a gRPC target without a scheme),
    up to the path, query or fragment."""
    scheme_end = url.find("://")
    start = scheme_end + 3 if scheme_end >= 0 else (2 if url.startswith("//") else 0)
    ends = [i for i in (url.find(c, start) for c in "/?#") if i >= 0]
    return start, min(ends, default=len(url))


def userinfo(url: str) -> str:
    """The user info of ``url`` (``user:password``, as written); empty when none."""
    start, end = _authority(url)
    info, at, _ = url[start:end].rpartition("@")
    return info if at else ""


def without_userinfo(url: str) -> str:
    """``url`` with its user info (and the ``@``) left out."""
    start, end = _authority(url)
    _, at, hostport = url[start:end].rpartition("@")
    return url[:start] + hostport + url[end:] if at else url


def masked(url: str) -> str:
    """``url`` as it may be said: the password of its user info replaced by
    :data:`MASK` (``http://user:***@host:4318``), a user info without a password
    (often a token) replaced whole (``http://***@host``); anything else as it is.
    A password with a ``/``, ``?`` or ``#`` not percent-encoded ends the authority
    early: an ``@`` past it after a ``user:`` is taken as the end of a user info all
    the same (a path with ``@`` in such a URL is masked too: a leak is worse)."""
    start, end = _authority(url)
    at = url.rfind("@", start, end)
    if at < 0:
        at = url.rfind("@", start)
        if at < 0 or ":" not in url[start:at]:
            return url
    user, colon, _ = url[start:at].partition(":")
    shown = f"{user}:{MASK}" if colon else MASK
    return url[:start] + shown + url[at:]


def basic_authorization(url: str) -> str | None:
    """The ``Authorization`` header value of ``url``'s user info, as the SDK's
    OTLP/HTTP exporter (``requests``) sends it: ``Basic`` with the percent-decoded
    user and password; None without user info or without a password (which that
    exporter does not send either)."""
    user, colon, password = userinfo(url).partition(":")
    if not colon:
        return None
    pair = f"{unquote(user)}:{unquote(password)}"
    try:
        raw = pair.encode("latin-1")
    except UnicodeEncodeError:
        raw = pair.encode()
    return "Basic " + base64.b64encode(raw).decode("ascii")


def grpc_target(endpoint: str) -> str:
    """The target the SDK's OTLP/gRPC exporter opens a channel to: the URL's
    ``host:port`` (its path dropped) when it has ``scheme://``, else the endpoint as
    written (``otel-collector:4317``, ``dns:///host:4317``)."""
    try:
        netloc = urlsplit(endpoint).netloc
    except ValueError:
        netloc = ""
    return netloc or endpoint


def grpc_insecure(endpoint: str, insecure: bool | None) -> bool:
    """Whether the SDK's OTLP/gRPC exporter opens a plain-text channel to
    ``endpoint``: never for ``https``, else ``insecure``
    (``OTEL_EXPORTER_OTLP_[<SIGNAL>_]INSECURE``) when set, else only for ``http``
    (an endpoint without a scheme gets TLS)."""
    try:
        scheme = urlsplit(endpoint).scheme
    except ValueError:
        scheme = ""
    if scheme == "https":
        return False
    return insecure if insecure is not None else scheme == "http"


def endpoint_problem(endpoint: str, protocol: str) -> str | None:
    """Why ``endpoint`` cannot work over ``protocol``, in words (no secret); None
    when it can. OTLP/HTTP needs an ``http://`` or ``https://`` URL that parses;
    OTLP/gRPC has no way to send a URL's user info (the SDK's exporter would take it
    as part of the host name)."""
    try:
        parts = urlsplit(endpoint)
        parts.port  # noqa: B018  (raises for a port that is not a number)
    except ValueError:  # (its message may quote part of a password)
        return "is not a URL"
    if protocol == "grpc":
        if userinfo(endpoint):
            return ("has user info, which OTLP/gRPC cannot send: give the credentials "
                    "as a header (OTEL_EXPORTER_OTLP_HEADERS=authorization=Basic%20...)")
        return None
    if parts.scheme not in HTTP_SCHEMES or not parts.hostname:
        return ("is not an http:// or https:// URL with a host, which OTLP/HTTP "
                "needs")
    return None

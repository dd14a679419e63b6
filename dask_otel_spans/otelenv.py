"""The standard ``OTEL_*`` variables as the package reads them, without the OTel SDK:
the exporters they name, the values that cannot work, the launcher, global providers."""
from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping

from dask_otel_spans.otlpendpoint import (
    configured_endpoint,
    endpoint_problem,
    endpoint_variable,
    masked,
)

#: Value of OTEL_{TRACES,METRICS,LOGS}_EXPORTER selecting the embedded file exporter
FILE_EXPORTER = "otlp_json_file"
#: What each exporter variable accepts
TRACE_EXPORTERS = ("otlp", "console", "none", FILE_EXPORTER)
METRIC_EXPORTERS = ("otlp", "console", "prometheus", "none", FILE_EXPORTER)
OTLP_PROTOCOLS = ("grpc", "http/protobuf")
OTLP_COMPRESSIONS = ("gzip", "deflate", "none")
#: Variables whose presence means "the user configured an exporter"
_CONFIGURING_VARIABLES = (
    "OTEL_TRACES_EXPORTER",
    "OTEL_METRICS_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
)
#: The module OpenTelemetry's auto-instrumentation (``opentelemetry-instrument``, the
#: Kubernetes Operator's injection) runs at interpreter start, from a folder it puts on
#: ``PYTHONPATH``
AUTO_INSTRUMENTATION = "opentelemetry.instrumentation.auto_instrumentation"


class ConfigurationError(ValueError):
    """An ``OTEL_*`` variable has a value this package cannot use."""


def is_unconfigured(environ: Mapping[str, str]) -> bool:
    """True when no exporter and no OTLP endpoint is configured at all: the embedded
    default's files are written."""
    return not any(environ.get(v) for v in _CONFIGURING_VARIABLES)


def exporter_names(environ: Mapping[str, str], variable: str) -> list[str]:
    """The exporters named by ``variable`` (``OTEL_TRACES_EXPORTER``, ...), lower case;
    ``otlp`` when unset."""
    return [
        n.strip().lower()
        for n in environ.get(variable, "otlp").split(",")
        if n.strip()
    ]


def not_one_of(variable: str, value: str, accepted: tuple[str, ...]
               ) -> ConfigurationError:
    """The error of ``variable`` set to ``value``, which is not one of ``accepted``."""
    return ConfigurationError(
        f"{variable}={value!r} is not one of {', '.join(accepted)}"
    )


def variable_of(environ: Mapping[str, str], signal: str, name: str) -> str:
    """Which variable gives ``OTEL_EXPORTER_OTLP_[<SIGNAL>_]<NAME>``."""
    specific = f"OTEL_EXPORTER_OTLP_{signal}_{name}"
    return specific if environ.get(specific) else f"OTEL_EXPORTER_OTLP_{name}"


def signal_setting(environ: Mapping[str, str], signal: str, name: str) -> str | None:
    """``OTEL_EXPORTER_OTLP_<SIGNAL>_<NAME>``, else ``OTEL_EXPORTER_OTLP_<NAME>``."""
    return environ.get(f"OTEL_EXPORTER_OTLP_{signal}_{name}") or environ.get(
        f"OTEL_EXPORTER_OTLP_{name}"
    )


def otlp_protocol(environ: Mapping[str, str], signal: str) -> str:
    """``OTEL_EXPORTER_OTLP_[<SIGNAL>_]PROTOCOL``, checked (default ``grpc``)."""
    protocol = (signal_setting(environ, signal, "PROTOCOL") or "grpc").strip()
    if protocol not in OTLP_PROTOCOLS:
        raise not_one_of(variable_of(environ, signal, "PROTOCOL"), protocol,
                         OTLP_PROTOCOLS)
    return protocol


def check_endpoint(environ: Mapping[str, str], signal: str, protocol: str) -> None:
    """Raise :class:`ConfigurationError` for an endpoint of ``signal`` that cannot
    work over ``protocol`` (:func:`~dask_otel_spans.otlpendpoint.endpoint_problem`),
    naming its variable and its value, user info masked."""
    endpoint = configured_endpoint(environ, signal, protocol)
    problem = endpoint and endpoint_problem(endpoint, protocol)
    variable = endpoint_variable(environ, signal)
    if problem and variable:
        value = environ[variable]
        raise ConfigurationError(f"{variable}={masked(value)!r} {problem} "
                                 f"(OTLP {protocol})")


def check_otlp_settings(environ: Mapping[str, str], signal: str) -> None:
    """Raise :class:`ConfigurationError` for an OTLP protocol, endpoint, compression
    or timeout of ``signal`` that its exporter could not be built with."""
    check_endpoint(environ, signal, otlp_protocol(environ, signal))
    compression = signal_setting(environ, signal, "COMPRESSION")
    if compression and compression.strip().lower() not in OTLP_COMPRESSIONS:
        raise not_one_of(variable_of(environ, signal, "COMPRESSION"),
                         compression, OTLP_COMPRESSIONS)
    timeout = signal_setting(environ, signal, "TIMEOUT")
    if timeout:
        try:
            ok = float(timeout) > 0
        except ValueError:
            ok = False
        if not ok:
            raise ConfigurationError(
                f"{variable_of(environ, signal, 'TIMEOUT')}={timeout!r} is not a "
                "positive number of seconds"
            )


def check_millis(environ: Mapping[str, str], variable: str) -> None:
    """Raise :class:`ConfigurationError` when ``variable`` is set and not a
    non-negative number of milliseconds."""
    value = environ.get(variable)
    if not value:
        return
    try:
        ok = float(value) >= 0
    except ValueError:
        ok = False
    if not ok:
        raise ConfigurationError(
            f"{variable}={value!r} is not a non-negative number of milliseconds"
        )


def check_environ(environ: Mapping[str, str]) -> None:
    """Raise :class:`ConfigurationError`, naming the variable, its value and what it
    accepts, for the first ``OTEL_*`` value the providers could not be built from."""
    if is_unconfigured(environ):
        return
    for variable, accepted, signal in (
        ("OTEL_TRACES_EXPORTER", TRACE_EXPORTERS, "TRACES"),
        ("OTEL_METRICS_EXPORTER", METRIC_EXPORTERS, "METRICS"),
    ):
        chosen = exporter_names(environ, variable)
        for name in chosen:
            if name not in accepted:
                raise not_one_of(variable, name, accepted)
        if "otlp" not in chosen:
            continue
        check_otlp_settings(environ, signal)
    for variable in ("OTEL_METRIC_EXPORT_INTERVAL", "OTEL_METRIC_EXPORT_TIMEOUT",
                     "OTEL_BSP_SCHEDULE_DELAY"):
        check_millis(environ, variable)


def under_auto_instrumentation() -> bool:
    """Whether this process runs under OpenTelemetry's auto-instrumentation: its
    global providers were then built by the launcher's configurator from the same
    ``OTEL_*`` variables the package reads, so they count as configuration, not as
    objects of this process."""
    # (Python imports the launcher's sitecustomize.py by that bare name)
    started_by = getattr(sys.modules.get("sitecustomize"), "__file__", None) or ""
    return os.path.dirname(started_by).endswith(AUTO_INSTRUMENTATION.replace(".", os.sep))


def has_global_sdk_providers() -> bool:
    """Whether the process has SDK tracer or meter providers installed as its global
    ones, found without importing the SDK: a provider of the SDK's classes exists
    only where their modules were imported (the API is asked only then)."""
    for module, cls, api, getter in (
        ("opentelemetry.sdk.trace", "TracerProvider", "opentelemetry.trace",
         "get_tracer_provider"),
        ("opentelemetry.sdk.metrics", "MeterProvider", "opentelemetry.metrics",
         "get_meter_provider"),
    ):
        sdk_class = getattr(sys.modules.get(module), cls, None)
        if sdk_class is None:
            continue
        provider = getattr(importlib.import_module(api), getter)()
        if isinstance(provider, sdk_class):
            return True
    return False

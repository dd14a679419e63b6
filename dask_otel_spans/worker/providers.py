"""The OpenTelemetry providers of a worker process, for task code and the
instrumentations it uses: the process's SDK providers when it has them (e.g. the
worker runs under ``opentelemetry-instrument``), else tracer, meter and (with
``OTEL_LOGS_EXPORTER``) logger providers built from the standard ``OTEL_*`` variables
and installed as the process's global ones. Each signal is built on its own: one
whose values cannot work is one ERROR line and goes nowhere, the others still work."""
from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeAlias

from opentelemetry import metrics as metrics_api
from opentelemetry import trace as trace_api

from dask_otel_spans import names
from dask_otel_spans.otelenv import (
    METRIC_EXPORTERS,
    TRACE_EXPORTERS,
    ConfigurationError,
    check_millis,
    check_otlp_settings,
    exporter_names,
    is_unconfigured,
    not_one_of,
)
from dask_otel_spans.sdk.logs import (
    build_logger_provider,
    global_sdk_logger_provider,
    log_exporter_names,
)
from dask_otel_spans.sdk.otlpjson import WORKERS_DIR, file_label, place_process_files
from dask_otel_spans.sdk.providers import (
    build_meter_provider,
    build_resource,
    build_tracer_provider,
    global_sdk_meter_provider,
    global_sdk_tracer_provider,
)

if TYPE_CHECKING:
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider

logger = logging.getLogger(__name__)

#: An SDK provider of one signal
Provider: TypeAlias = "TracerProvider | MeterProvider | LoggerProvider"


@dataclass
class WorkerProviders:
    """The worker process's providers, and which of them this package built."""

    tracer_provider: TracerProvider | None = None
    meter_provider: MeterProvider | None = None
    #: None unless ``OTEL_LOGS_EXPORTER`` asks for one (or the process had one)
    logger_provider: LoggerProvider | None = None
    #: built here; :func:`worker_providers` installs them as the global providers
    #: (flushed at teardown; the SDK shuts them down at exit)
    built: list[Provider] = field(default_factory=list)
    traces_to: str = "nowhere"
    metrics_to: str = "nowhere"
    logs_to: str = "nowhere"
    #: one line per signal that could not be built (each logged as one ERROR)
    errors: list[str] = field(default_factory=list)


def process_output_dir(output_dir: str, worker_name: object) -> str:
    """The embedded default's directory of one worker process: a directory of its
    own below ``output_dir`` (no two processes append to one file)."""
    return os.path.join(output_dir, WORKERS_DIR,
                        f"{file_label(worker_name, 'worker')}-{os.getpid()}")


def worker_label(address: str, name: object) -> str:
    """How a worker's log lines name it, in aggregated logs where nothing else says
    which process a line came from: ``worker 0 (tcp://10.0.0.5:40123)``, or
    ``worker tcp://10.0.0.5:40123`` when its name is its address."""
    return (f"worker {address}" if name is None or str(name) in ("", str(address))
            else f"worker {name} ({address})")


def worker_resource_attributes(address: str, name: object) -> dict[str, str]:
    return {names.WORKER_ADDRESS: str(address), names.WORKER_NAME: str(name)}


def _check_exporters(environ: Mapping[str, str], variable: str,
                     accepted: tuple[str, ...], signal: str) -> list[str]:
    """The exporters ``variable`` names, each one of ``accepted``, and the OTLP
    settings of ``signal`` when one is ``otlp``; raises
    :class:`~dask_otel_spans.otelenv.ConfigurationError` otherwise."""
    chosen = exporter_names(environ, variable)
    for name in chosen:
        if name not in accepted:
            raise not_one_of(variable, name, accepted)
    if "otlp" in chosen:
        check_otlp_settings(environ, signal)
    return chosen


def check_traces_settings(environ: Mapping[str, str]) -> None:
    """Raise :class:`~dask_otel_spans.otelenv.ConfigurationError`, naming the
    variable and its value, for a value the tracer provider could not be built from
    (the metrics' and logs' values are not looked at)."""
    # (the batch processor reads it with nothing configured too)
    check_millis(environ, "OTEL_BSP_SCHEDULE_DELAY")
    if not is_unconfigured(environ):
        _check_exporters(environ, "OTEL_TRACES_EXPORTER", TRACE_EXPORTERS, "TRACES")


def check_metrics_settings(environ: Mapping[str, str]) -> None:
    """As :func:`check_traces_settings`, for the meter provider: its exporters, their
    OTLP settings, the export interval and, for ``prometheus``, the extra it needs
    and its port."""
    check_millis(environ, "OTEL_METRIC_EXPORT_INTERVAL")
    if is_unconfigured(environ):
        return
    chosen = _check_exporters(environ, "OTEL_METRICS_EXPORTER", METRIC_EXPORTERS,
                              "METRICS")
    if "prometheus" not in chosen:
        return
    try:
        importlib.import_module("opentelemetry.exporter.prometheus")
    except ImportError as e:
        raise ConfigurationError(
            "OTEL_METRICS_EXPORTER=prometheus needs opentelemetry-exporter-prometheus "
            "(pip install 'dask_otel_spans[prometheus]')"
        ) from e
    port = environ.get("OTEL_EXPORTER_PROMETHEUS_PORT")
    if port:
        try:
            ok = 0 <= int(port) <= 65535
        except ValueError:
            ok = False
        if not ok:
            raise ConfigurationError(
                f"OTEL_EXPORTER_PROMETHEUS_PORT={port!r} is not a port number"
            )


def check_logs_settings(environ: Mapping[str, str]) -> None:
    """As :func:`check_traces_settings`, for the logger provider."""
    if "otlp" in log_exporter_names(environ):
        check_otlp_settings(environ, "LOGS")


#: Per signal: the variable that chooses its exporters
_SIGNAL_VARIABLES = {
    "traces": "OTEL_TRACES_EXPORTER",
    "metrics": "OTEL_METRICS_EXPORTER",
    "logs": "OTEL_LOGS_EXPORTER",
}


def _build_signal(
    signal: str,
    environ: Mapping[str, str],
    check: Callable[[Mapping[str, str]], None],
    build: Callable[[], tuple[Provider | None, str]],
    out: WorkerProviders,
    worker: str,
) -> tuple[Provider | None, str]:
    """``build()`` once ``check(environ)`` passed; ``(None, "nowhere (why)")`` and
    one ERROR line, naming the variable and its value, when either fails (the
    other signals are built all the same)."""
    try:
        check(environ)
        provider, where = build()
    except Exception as e:
        if isinstance(e, ConfigurationError):
            reason = str(e)
        else:
            variable = _SIGNAL_VARIABLES[signal]
            reason = (f"{variable}={environ.get(variable, '')!r}: "
                      f"{type(e).__name__}: {e}")
        others = " and ".join(s for s in _SIGNAL_VARIABLES if s != signal)
        out.errors.append(reason)
        logger.error("dask_otel_spans: %s exports no %s: %s; its %s are "
                     "not affected", worker, signal, reason, others)
        return None, f"nowhere ({reason})"
    if provider is not None:
        out.built.append(provider)
    return provider, where


def build_worker_providers(
    address: str,
    name: object,
    *,
    environ: Mapping[str, str] | None = None,
    output_dir: str = "dask-otel-spans",
    use_global: bool = True,
) -> WorkerProviders:
    """The process's SDK providers (with ``use_global``), or providers built from
    ``environ`` (default ``os.environ``), installing nothing; with nothing
    configured, the embedded default: OTLP-JSON lines files in a directory of this
    process's below ``output_dir``.

    Each signal (traces, metrics, logs) is built on its own: one whose ``OTEL_*``
    values cannot work is one ERROR line naming the variable and its value, and
    goes nowhere (listed in ``errors``); the others are built all the same. Never
    raises for a configuration."""
    environ = os.environ if environ is None else environ
    out = WorkerProviders()
    resource = build_resource(
        environ, default_service_name=names.DEFAULT_WORKER_SERVICE_NAME,
        attributes=worker_resource_attributes(address, name),
    )
    files = process_output_dir(output_dir, name)
    worker = worker_label(address, name)

    # signal, the provider's kind, the global one, the settings' check, the builder
    signals = (
        ("traces", "tracer", global_sdk_tracer_provider, check_traces_settings,
         lambda: build_tracer_provider(environ, resource, files, process=worker)),
        ("metrics", "meter", global_sdk_meter_provider, check_metrics_settings,
         lambda: build_meter_provider(environ, resource, files, process=worker)),
        ("logs", "logger", global_sdk_logger_provider, check_logs_settings,
         lambda: build_logger_provider(environ, resource)),
    )
    for signal, kind, global_provider, check, build in signals:
        provider = global_provider() if use_global else None
        if provider is not None:
            where = f"the global {kind} provider"
        else:
            provider, where = _build_signal(signal, environ, check, build, out,
                                            worker)
        setattr(out, f"{kind}_provider", provider)
        setattr(out, f"{signal}_to", where)
    return out


def worker_providers(
    address: str,
    name: object,
    *,
    environ: Mapping[str, str] | None = None,
    output_dir: str = "dask-otel-spans",
) -> WorkerProviders:
    """The process's SDK providers, or providers built from ``environ`` (default
    ``os.environ``) and installed as the global ones: see
    :func:`build_worker_providers` (a signal that cannot be built is one ERROR line
    and goes nowhere; the others are installed)."""
    out = build_worker_providers(address, name, environ=environ, output_dir=output_dir)
    # (the file exporters that the launcher's configurator built in this process
    # write into the worker's directory too)
    place_process_files(process_output_dir(output_dir, name))
    if out.tracer_provider in out.built:
        trace_api.set_tracer_provider(out.tracer_provider)
    if out.meter_provider in out.built:
        metrics_api.set_meter_provider(out.meter_provider)
    if out.logger_provider in out.built:
        from opentelemetry import _logs

        _logs.set_logger_provider(out.logger_provider)
    return out

"""The OpenTelemetry providers of a worker process, for task code and the
instrumentations it uses: the process's SDK providers when it has them (e.g. the
worker runs under ``opentelemetry-instrument``), else tracer, meter and (with
``OTEL_LOGS_EXPORTER``) logger providers built from the standard ``OTEL_*`` variables
and installed as the process's global ones."""
from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import metrics as metrics_api
from opentelemetry import trace as trace_api

from dask_otel_spans import names
from dask_otel_spans.otlp_exporters import (
    check_otlp_settings,
    not_one_of,
    otlp_exporter,
)
from dask_otel_spans.providers import build_resource, check_environ, resolve_providers

logger = logging.getLogger(__name__)

#: ``OTEL_LOGS_EXPORTER`` values (unset: log records are not exported)
LOG_EXPORTERS = ("otlp", "console", "none")


@dataclass
class WorkerProviders:
    """The worker process's providers, and which of them this package installed."""

    tracer_provider: Any = None
    meter_provider: Any = None
    #: None unless ``OTEL_LOGS_EXPORTER`` asks for one (or the process had one)
    logger_provider: Any = None
    #: built here and installed as the global providers (flushed at teardown; the
    #: SDK shuts them down at exit)
    installed: list[Any] = field(default_factory=list)
    traces_to: str = "nowhere"
    logs_to: str = "nowhere"


def process_output_dir(output_dir: str, worker_name: Any) -> str:
    """The embedded default's directory of one worker process: a directory of its
    own below ``output_dir`` (no two processes append to one file)."""
    label = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(worker_name))[:64] or "worker"
    return os.path.join(output_dir, "workers", f"{label}-{os.getpid()}")


def worker_resource_attributes(address: str, name: Any) -> dict[str, str]:
    return {names.WORKER_ADDRESS: str(address), names.WORKER_NAME: str(name)}


def log_exporter_names(environ: Mapping[str, str]) -> list[str]:
    """The exporters ``OTEL_LOGS_EXPORTER`` names (none when unset); raises
    :class:`~dask_otel_spans.otlp_exporters.ConfigurationError` naming a value it
    cannot use."""
    names_ = [n.strip().lower() for n in environ.get("OTEL_LOGS_EXPORTER", "").split(",")
              if n.strip()]
    for name in names_:
        if name not in LOG_EXPORTERS:
            raise not_one_of("OTEL_LOGS_EXPORTER", name, LOG_EXPORTERS)
    return names_


def build_logger_provider(environ: Mapping[str, str], resource: Any
                          ) -> tuple[Any, str]:
    """A logger provider with one batch processor per exporter of
    ``OTEL_LOGS_EXPORTER`` (``otlp``, ``console``); ``(None, why)`` when it is unset
    or ``none``."""
    chosen = [n for n in log_exporter_names(environ) if n != "none"]
    if not chosen:
        return None, "nowhere (OTEL_LOGS_EXPORTER unset or none)"
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import (
        BatchLogRecordProcessor,
        ConsoleLogExporter,
    )

    provider = LoggerProvider(resource=resource)
    where = []
    for name in chosen:
        if name == "otlp":
            exporter, description = otlp_exporter(environ, "LOGS")
            where.append(description)
        else:  # (console: the names were checked)
            exporter = ConsoleLogExporter()
            where.append("the console")
        provider.add_log_record_processor(BatchLogRecordProcessor(exporter))
    return provider, ", ".join(where)


def global_sdk_logger_provider() -> Any:
    from opentelemetry import _logs
    from opentelemetry.sdk._logs import LoggerProvider

    provider = _logs.get_logger_provider()
    return provider if isinstance(provider, LoggerProvider) else None


def worker_providers(
    address: str,
    name: Any,
    *,
    environ: Mapping[str, str] | None = None,
    output_dir: str = "dask-otel-spans",
) -> WorkerProviders:
    """The process's SDK providers, or providers built from ``environ`` (default
    ``os.environ``) and installed as the global ones (the embedded default, with
    nothing configured: OTLP-JSON lines files in a directory of this process's
    below ``output_dir``). Raises
    :class:`~dask_otel_spans.otlp_exporters.ConfigurationError` for a configuration
    that cannot work, before installing anything (the caller logs it)."""
    environ = os.environ if environ is None else environ
    # (every value checked before anything is installed: a bad one installs nothing)
    check_environ(environ)
    if "otlp" in log_exporter_names(environ):
        check_otlp_settings(environ, "LOGS")
    out = WorkerProviders()
    resource_attributes = worker_resource_attributes(address, name)
    built = resolve_providers(
        environ=environ, output_dir=process_output_dir(output_dir, name),
        default_service_name=names.DEFAULT_WORKER_SERVICE_NAME,
        resource_attributes=resource_attributes,
    )
    out.tracer_provider, out.meter_provider = built.tracer_provider, built.meter_provider
    out.traces_to = built.traces_to
    if built.tracer_provider is not None and built.tracer_provider in built.owned:
        trace_api.set_tracer_provider(built.tracer_provider)
        out.installed.append(built.tracer_provider)
    if built.meter_provider is not None and built.meter_provider in built.owned:
        metrics_api.set_meter_provider(built.meter_provider)
        out.installed.append(built.meter_provider)
    out.logger_provider = global_sdk_logger_provider()
    if out.logger_provider is not None:
        out.logs_to = "the global logger provider"
    else:
        resource = build_resource(
            environ, default_service_name=names.DEFAULT_WORKER_SERVICE_NAME,
            attributes=resource_attributes,
        )
        out.logger_provider, out.logs_to = build_logger_provider(environ, resource)
        if out.logger_provider is not None:
            from opentelemetry import _logs

            _logs.set_logger_provider(out.logger_provider)
            out.installed.append(out.logger_provider)
    return out


"""The log signal: which signal carries erred tasks' exceptions (the semantic
conventions' opt-in), and logger providers built from ``OTEL_LOGS_EXPORTER`` (the
scheduler's exception log events, a worker's task log records)."""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dask_otel_spans.otelenv import FILE_EXPORTER, is_unconfigured, not_one_of
from dask_otel_spans.sdk.otlp import otlp_exporter
from dask_otel_spans.sdk.otlpjson import LOGS_FILE, OTLPJsonLinesLogExporter

if TYPE_CHECKING:
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import LogRecordExporter
    from opentelemetry.sdk.resources import Resource

    from dask_otel_spans.sdk.delivery import Delivery
    from dask_otel_spans.sdk.health import ExportHealth

#: ``OTEL_LOGS_EXPORTER`` values (unset: log records are not exported; the embedded
#: default's file when nothing at all is configured)
LOG_EXPORTERS = ("otlp", "console", "none", FILE_EXPORTER)
#: The semantic conventions' opt-in that moves exceptions from span events to log
#: events: unset, span events; ``logs``, log events only; ``logs/dup``, both
EXCEPTION_SIGNAL_OPT_IN = "OTEL_SEMCONV_EXCEPTION_SIGNAL_OPT_IN"


@dataclass(frozen=True)
class ExceptionSignals:
    """Where erred tasks' exceptions go, as ``OTEL_SEMCONV_EXCEPTION_SIGNAL_OPT_IN``
    says (a comma-separated list; ``logs/dup`` wins over ``logs``)."""

    events: bool = True
    logs: bool = False

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> ExceptionSignals:
        values = {v.strip().lower()
                  for v in (environ.get(EXCEPTION_SIGNAL_OPT_IN) or "").split(",")}
        if "logs/dup" in values:
            return cls(events=True, logs=True)
        if "logs" in values:
            return cls(events=False, logs=True)
        return cls()


def log_exporter_names(environ: Mapping[str, str]) -> list[str]:
    """The exporters ``OTEL_LOGS_EXPORTER`` names (none when unset); raises
    :class:`~dask_otel_spans.otelenv.ConfigurationError` naming a value it
    cannot use."""
    names_ = [n.strip().lower() for n in environ.get("OTEL_LOGS_EXPORTER", "").split(",")
              if n.strip()]
    for name in names_:
        if name not in LOG_EXPORTERS:
            raise not_one_of("OTEL_LOGS_EXPORTER", name, LOG_EXPORTERS)
    return names_


def build_logger_provider(environ: Mapping[str, str], resource: Resource,
                          output_dir: str | None = None, delivery: Delivery | None = None,
                          health: list[ExportHealth] | None = None
                          ) -> tuple[LoggerProvider | None, str]:
    """A logger provider with one batch processor per exporter of
    ``OTEL_LOGS_EXPORTER`` (``otlp``, ``console``, the embedded default's file
    ``otlp_json_file``, which is the one with nothing configured at all when an
    ``output_dir`` is given); ``(None, why)`` when there is none. An OTLP one holds
    what it could not deliver in ``delivery``
    (:class:`~dask_otel_spans.sdk.delivery.Delivery`, when given), counted in an
    :class:`~dask_otel_spans.sdk.health.ExportHealth` appended to ``health``."""
    chosen = log_exporter_names(environ)
    if not chosen and output_dir is not None and is_unconfigured(environ):
        chosen = [FILE_EXPORTER]
    chosen = [n for n in chosen if n != "none"]
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
        if name == "otlp" and delivery is not None:
            exporter, description = _holding(environ, delivery, health)
            where.append(description)
        elif name == "otlp":
            exporter, description = otlp_exporter(environ, "LOGS")
            where.append(description)
        elif name == FILE_EXPORTER:
            exporter = OTLPJsonLinesLogExporter(
                os.path.join(output_dir or ".", LOGS_FILE))
            where.append(exporter.path)
        else:  # (console: the names were checked)
            exporter = ConsoleLogExporter()
            where.append("the console")
        provider.add_log_record_processor(BatchLogRecordProcessor(exporter))
    return provider, ", ".join(where)


def _holding(environ: Mapping[str, str], delivery: Delivery,
             health: list[ExportHealth] | None) -> tuple[LogRecordExporter, str]:
    """An OTLP log exporter whose batches ``delivery`` sends and holds, and where
    it sends."""
    from dask_otel_spans.sdk.destination import destination_of
    from dask_otel_spans.sdk.health import ExportHealth
    from dask_otel_spans.sdk.holding import holding_log_exporter
    from dask_otel_spans.sdk.otlpsend import request_sender

    sender = request_sender(environ, "logs")
    exporter_health = ExportHealth("logs", sender.where)
    if health is not None:
        health.append(exporter_health)
    delivery.add_destination(destination_of(environ, "logs"), sender, exporter_health)
    return holding_log_exporter(delivery, exporter_health), sender.where


def global_sdk_logger_provider() -> LoggerProvider | None:
    from opentelemetry import _logs
    from opentelemetry.sdk._logs import LoggerProvider

    provider = _logs.get_logger_provider()
    return provider if isinstance(provider, LoggerProvider) else None


def live_records_wanted(environ: Mapping[str, str], embedded_traces: bool,
                        global_provider: bool) -> bool:
    """Whether the records of running spans (``dask.span.started``,
    ``dask.span.progress``) get a logger provider when the exception signal opt-in
    does not ask for one: ``OTEL_LOGS_EXPORTER`` names an exporter (``none``
    included: then nothing is built), a global SDK logger provider is there, or
    traces go to the embedded default (nothing configured: its ``logs.jsonl``).
    Providers given to the plugin, without ``OTEL_LOGS_EXPORTER``, make no records.
    An ``OTEL_LOGS_EXPORTER`` it cannot use is one ERROR line, and no records."""
    try:
        if log_exporter_names(environ):
            return True
    except Exception as e:
        import logging

        logging.getLogger(__name__).error(
            "dask_otel_spans: %s; the records of running spans are not made", e)
        return False
    return global_provider or (embedded_traces and is_unconfigured(environ))

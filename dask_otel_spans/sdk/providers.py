"""Tracer and meter providers for the plugin: explicit arguments, else the process's
global SDK providers, else providers built from the standard ``OTEL_*`` variables,
else the embedded default (OTLP-JSON lines files, no collector needed)."""
from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypeAlias, TypeVar
from urllib.parse import unquote

from opentelemetry import metrics as metrics_api
from opentelemetry import trace as trace_api
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.metrics.view import View
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
)

from dask_otel_spans import names
from dask_otel_spans.otelenv import (
    FILE_EXPORTER,
    METRIC_EXPORTERS,
    TRACE_EXPORTERS,
    ConfigurationError,
    exporter_names,
    is_unconfigured,
    not_one_of,
)
from dask_otel_spans.protocol.figures import SIGNALS, SignalFigures
from dask_otel_spans.sdk.delivery import Delivery
from dask_otel_spans.sdk.destination import destination_of
from dask_otel_spans.sdk.health import (
    ExportHealth,
    HealthMetricExporter,
    HealthSpanExporter,
)
from dask_otel_spans.sdk.holding import (
    HoldingMetricExporter,
    HoldingSpanExporter,
    prefers_delta,
)
from dask_otel_spans.sdk.logs import (
    ExceptionSignals,
    build_logger_provider,
    global_sdk_logger_provider,
    live_records_wanted,
)
from dask_otel_spans.sdk.otlp import otlp_exporter
from dask_otel_spans.sdk.otlpjson import (
    METRICS_FILE,
    TRACES_FILE,
    OTLPJsonLinesMetricExporter,
    OTLPJsonLinesSpanExporter,
)
from dask_otel_spans.sdk.otlpsend import request_sender
from dask_otel_spans.sdk.sending import SendingMetricExporter

if TYPE_CHECKING:
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.util.types import AttributeValue

    #: A provider the package built (or a factory's): it has ``shutdown``
    SdkProvider: TypeAlias = "TracerProvider | MeterProvider | LoggerProvider"
    #: A provider in use: a given one is the API's (anything the plugin was handed)
    InUse: TypeAlias = "trace_api.TracerProvider | metrics_api.MeterProvider | LoggerProvider"

logger = logging.getLogger(__name__)

#: A signal's provider in use (given, global, or built: :func:`_provider`)
_P = TypeVar("_P")
#: A signal's provider as built
_B = TypeVar("_B", bound="SdkProvider")

#: The OpenTelemetry SDK's default cardinality limit: distinct attribute sets per
#: instrument and reader; further sets land, attributes dropped, in one point marked
#: ``otel.metric.overflow``
SDK_DEFAULT_CARDINALITY_LIMIT = 2000


#: Batch span processor delay when OTEL_BSP_SCHEDULE_DELAY is not set (SDK: 5000)
DEFAULT_BSP_SCHEDULE_DELAY_MS = 500


@dataclass
class Providers:
    """The providers the plugin uses and which of them it owns (shuts down)."""

    tracer_provider: trace_api.TracerProvider | None = None
    meter_provider: metrics_api.MeterProvider | None = None
    owned: list[SdkProvider] = field(default_factory=list)
    #: those the package built from configuration (the embedded default, ``OTEL_*``):
    #: it owns their whole pipeline, so spans are built directly for them; not a
    #: factory's, which are the user's own
    built: list[SdkProvider] = field(default_factory=list)
    #: human-readable "where do traces / metrics go", for the log line
    traces_to: str = "nowhere"
    metrics_to: str = "nowhere"
    #: outage bookkeeping of the exporters built here (one per exporter)
    health: list[ExportHealth] = field(default_factory=list)
    #: where erred tasks' exceptions go (``OTEL_SEMCONV_EXCEPTION_SIGNAL_OPT_IN``)
    exceptions: ExceptionSignals = field(default_factory=lambda: ExceptionSignals())
    #: the exception log events' provider, when ``exceptions.logs``
    logger_provider: LoggerProvider | None = None
    logs_to: str = "nowhere"
    #: what holds and sends again the batches the OTLP exporters built here could
    #: not deliver (None: nothing is held)
    redelivery: Delivery | None = None
    #: the directory of the traces file a tracer provider built here writes (the
    #: embedded default, ``otlp_json_file``); None when none does
    files_dir: str | None = None

    @property
    def exceptions_to(self) -> str:
        """Where erred tasks' exceptions go, for the start-up line."""
        # (span events go where the traces go: with none, nowhere)
        parts = (["span events"] if self.exceptions.events
                 and self.tracer_provider is not None else [])
        if self.exceptions.logs:
            parts.append(f"log events to {self.logs_to}")
        return " and ".join(parts) or "nowhere (no traces, no exception logs)"

    @property
    def all(self) -> tuple[InUse, ...]:
        """The providers in use, of every signal."""
        return tuple(p for p in (self.tracer_provider, self.meter_provider,
                                 self.logger_provider) if p is not None)

    def delivery(self) -> dict[str, SignalFigures]:
        """What the exporters built here reported, per signal (OTel spans, metric
        points, log records). With several exporters for a signal, delivered is the
        fewest any of them delivered and failed the most any of them failed; None
        where no exporter of the signal was built here (given or global providers, a
        pull reader such as Prometheus)."""
        out = {}
        for signal in SIGNALS:
            health = [h for h in self.health if h.signal == signal]
            delivered = min(h.delivered for h in health) if health else None
            failed = max(h.failed for h in health) if health else None
            out[signal] = (self.redelivery.figures(signal, delivered, failed)
                           if self.redelivery is not None
                           else SignalFigures(delivered, failed))
        return out

    @property
    def spool_directory(self) -> str | None:
        """Where batches that could not be delivered are spooled (None: in memory
        only, or nothing is held)."""
        return self.redelivery.spool.directory if self.redelivery is not None else None

    def delivering(self) -> bool:
        """Whether the last export of every exporter built here succeeded (True
        before any export) and nothing is held."""
        held = self.redelivery is not None and self.redelivery.waiting()
        return not held and not any(h.down for h in self.health)


def build_resource(
    environ: Mapping[str, str],
    scheduler_address: str | None = None,
    *,
    default_service_name: str = names.DEFAULT_SERVICE_NAME,
    attributes: Mapping[str, AttributeValue] | None = None,
) -> Resource:
    """``service.name`` = OTEL_SERVICE_NAME, else OTEL_RESOURCE_ATTRIBUTES' one, else
    ``default_service_name``; ``service.instance.id`` = a new random UUID (one per
    resource built: one per exporting process) unless OTEL_RESOURCE_ATTRIBUTES or
    ``attributes`` set one; plus ``dask.scheduler.address`` (when given),
    ``attributes`` and OTEL_RESOURCE_ATTRIBUTES."""
    attrs: dict[str, AttributeValue] = {names.SERVICE_NAME: default_service_name,
                                        names.SERVICE_INSTANCE_ID: str(uuid.uuid4())}
    if scheduler_address:
        attrs[names.SCHEDULER_ADDRESS] = scheduler_address
    attrs.update(attributes or {})
    for item in environ.get("OTEL_RESOURCE_ATTRIBUTES", "").split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            attrs[key.strip()] = unquote(value.strip())
    if environ.get("OTEL_SERVICE_NAME"):
        attrs[names.SERVICE_NAME] = environ["OTEL_SERVICE_NAME"]
    return Resource.create(attrs)


def _span_exporter(name: str, environ: Mapping[str, str],
                   output_dir: str) -> tuple[SpanExporter, str]:
    if name == "otlp":
        return otlp_exporter(environ, "TRACES")
    if name == "console":
        return ConsoleSpanExporter(), "the console"
    if name == FILE_EXPORTER:
        exporter = OTLPJsonLinesSpanExporter(os.path.join(output_dir, TRACES_FILE))
        return exporter, exporter.path
    raise not_one_of("OTEL_TRACES_EXPORTER", name, TRACE_EXPORTERS)


def _metric_reader(
    name: str,
    environ: Mapping[str, str],
    output_dir: str,
    health: list[ExportHealth] | None = None,
    delivery: Delivery | None = None,
    process: str = "",
) -> tuple[MetricReader, str]:
    interval = float(environ.get("OTEL_METRIC_EXPORT_INTERVAL") or 60_000)
    if name == "otlp":
        exporter, where = otlp_exporter(environ, "METRICS")
    elif name == "console":
        exporter, where = ConsoleMetricExporter(), "the console"
    elif name == FILE_EXPORTER:
        exporter = OTLPJsonLinesMetricExporter(os.path.join(output_dir, METRICS_FILE))
        where = exporter.path
    elif name == "prometheus":
        return _prometheus_reader(environ)
    else:
        raise not_one_of("OTEL_METRICS_EXPORTER", name, METRIC_EXPORTERS)
    exporter_health = ExportHealth("metrics", where, process=process)
    if health is not None:
        health.append(exporter_health)
    if name == "otlp" and delivery is not None:
        # (the SDK's exporter only told the preferences: points are encoded by the
        # package, delta ones sent and held by the delivery, cumulative ones sent
        # once per export, as they need no holding: the next export carries the
        # totals)
        if prefers_delta(exporter):
            delivery.add_destination(destination_of(environ, "metrics"),
                                     request_sender(environ, "metrics"), exporter_health)
            wrapped: MetricExporter = HoldingMetricExporter(exporter, delivery,
                                                            exporter_health)
        else:
            wrapped = SendingMetricExporter(exporter, request_sender(environ, "metrics"),
                                            exporter_health)
        exporter.shutdown()
    else:
        wrapped = HealthMetricExporter(exporter, exporter_health)
    timeout = environ.get("OTEL_METRIC_EXPORT_TIMEOUT")
    reader = PeriodicExportingMetricReader(
        wrapped, export_interval_millis=interval,
        export_timeout_millis=float(timeout) if timeout else None)
    return reader, where


def _prometheus_reader(environ: Mapping[str, str]) -> tuple[MetricReader, str]:
    try:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
    except ImportError as e:
        raise ConfigurationError(
            "OTEL_METRICS_EXPORTER=prometheus needs opentelemetry-exporter-prometheus "
            "(pip install 'dask_otel_spans[prometheus]')"
        ) from e
    reader = PrometheusMetricReader()
    port = environ.get("OTEL_EXPORTER_PROMETHEUS_PORT")
    if not port:  # (then export runs in the scheduler process: transport/choice.py)
        return reader, "the scheduler's /metrics (prometheus_client default registry)"
    from prometheus_client import start_http_server

    host = environ.get("OTEL_EXPORTER_PROMETHEUS_HOST", "0.0.0.0")
    start_http_server(int(port), addr=host)
    # (served by the process that exports: the export process by default, whose
    # registry the scheduler's own /metrics does not show)
    return reader, f"http://{host}:{port}/metrics"


def _trace_exporters(environ: Mapping[str, str]) -> list[str]:
    names_ = ([FILE_EXPORTER] if is_unconfigured(environ)
              else exporter_names(environ, "OTEL_TRACES_EXPORTER"))
    return [e for e in names_ if e != "none"]


def build_tracer_provider(
    environ: Mapping[str, str],
    resource: Resource,
    output_dir: str,
    health: list[ExportHealth] | None = None,
    delivery: Delivery | None = None,
    process: str = "",
) -> tuple[TracerProvider | None, str]:
    """A tracer provider with one batch processor per configured exporter; an OTLP
    one holds what it could not deliver in ``delivery`` (when given). ``process``:
    the process its exporters' log lines name (:class:`ExportHealth`)."""
    exporters = _trace_exporters(environ)
    if not exporters:
        return None, "nowhere (OTEL_TRACES_EXPORTER=none)"
    provider = TracerProvider(resource=resource)
    # The SDK waits 5 s by default before a batch goes out; spans are handed over after a
    # grace period already, so export sooner unless the user chose a delay.
    delay = float(environ.get("OTEL_BSP_SCHEDULE_DELAY") or DEFAULT_BSP_SCHEDULE_DELAY_MS)
    where = []
    for name in exporters:
        if name == "otlp" and delivery is not None:
            sender = request_sender(environ, "traces")
            description = sender.where
            exporter_health = ExportHealth("traces", description, process=process)
            delivery.add_destination(destination_of(environ, "traces"), sender,
                                     exporter_health)
            wrapped: SpanExporter = HoldingSpanExporter(delivery, exporter_health)
        else:
            exporter, description = _span_exporter(name, environ, output_dir)
            exporter_health = ExportHealth("traces", description, process=process)
            wrapped = HealthSpanExporter(exporter, exporter_health)
        if health is not None:
            health.append(exporter_health)
        provider.add_span_processor(
            BatchSpanProcessor(wrapped, schedule_delay_millis=delay)
        )
        where.append(description)
    return provider, ", ".join(where)


def _series_limit_views(series_limit: int | None) -> list[View]:
    """Views that let the package's instruments keep ``series_limit`` attribute sets
    where that is above the SDK's default cardinality limit (none are needed below
    it, nor on SDKs without cardinality limits)."""
    if series_limit is None or series_limit <= SDK_DEFAULT_CARDINALITY_LIMIT:
        return []
    try:
        return [View(instrument_name="dask.*",  # type: ignore[call-arg]  # (SDK >= 1.33)
                     aggregation_cardinality_limit=series_limit)]
    except TypeError:  # an SDK without cardinality limits
        return []


def build_meter_provider(
    environ: Mapping[str, str],
    resource: Resource,
    output_dir: str,
    health: list[ExportHealth] | None = None,
    series_limit: int | None = None,
    delivery: Delivery | None = None,
    process: str = "",
) -> tuple[MeterProvider | None, str]:
    """A meter provider with one reader per configured exporter; the package's
    instruments may keep ``series_limit`` series each (otel-spans.metrics.max-series).
    ``process``: the process its exporters' log lines name (:class:`ExportHealth`)."""
    exporters = (
        [FILE_EXPORTER]
        if is_unconfigured(environ)
        else exporter_names(environ, "OTEL_METRICS_EXPORTER")
    )
    exporters = [e for e in exporters if e != "none"]
    if not exporters:
        return None, "nowhere (OTEL_METRICS_EXPORTER=none)"
    readers, where = [], []
    for name in exporters:
        reader, description = _metric_reader(name, environ, output_dir, health,
                                             delivery, process)
        readers.append(reader)
        where.append(description)
    provider = MeterProvider(
        metric_readers=readers, resource=resource, views=_series_limit_views(series_limit)
    )
    return provider, ", ".join(where)


class Flushable(Protocol):
    """A provider that can be flushed (the SDK's; a given one may be another)."""

    def force_flush(self, timeout_millis: int = ...) -> bool: ...


def flush_provider(provider: Flushable, timeout_millis: int) -> bool:
    """Flush ``provider``'s exporters: a tracer provider's span processors, a meter
    provider's push readers only.

    A pull reader (Prometheus, in-memory) is never flushed: the SDK's pull readers
    queue one collection per flush, and the next scrape would yield them all (each
    metric family repeated, old values among them). The specification does not
    require ``ForceFlush`` of pull readers. False when an exporter did not finish.
    """
    if not isinstance(provider, MeterProvider):
        return provider.force_flush(timeout_millis) is not False
    ok = True
    for reader in _metric_readers(provider):
        if isinstance(reader, PeriodicExportingMetricReader):
            ok = reader.force_flush(timeout_millis) is not False and ok
    return ok


def _metric_readers(provider: MeterProvider) -> Sequence[MetricReader]:
    """The readers of an SDK meter provider (the SDK has no public accessor: its
    attribute has had two names); none where it cannot be found, so that no pull
    reader is ever flushed by mistake."""
    readers = getattr(provider, "_metric_readers", None)
    if readers is None:
        readers = getattr(getattr(provider, "_sdk_config", None), "metric_readers", None)
    return tuple(readers or ())


def global_sdk_tracer_provider() -> TracerProvider | None:
    provider = trace_api.get_tracer_provider()
    return provider if isinstance(provider, TracerProvider) else None


def global_sdk_meter_provider() -> MeterProvider | None:
    provider = metrics_api.get_meter_provider()
    return provider if isinstance(provider, MeterProvider) else None


def _provider(out: Providers, kind: str, given: _P | None, global_provider: _P | None,
              build: Callable[[], tuple[_B | None, str]]) -> tuple[_P | _B | None, str]:
    """One signal's provider and where it goes: the given one, else the global one,
    else one built (then owned: shut down with the plugin)."""
    if given is not None:
        return given, f"the given {kind} provider"
    if global_provider is not None:
        return global_provider, f"the global {kind} provider"
    provider, where = build()
    if provider is not None:
        out.owned.append(provider)
        out.built.append(provider)
    return provider, where


def resolve_providers(
    *,
    tracer_provider: trace_api.TracerProvider | None = None,
    meter_provider: metrics_api.MeterProvider | None = None,
    environ: Mapping[str, str] | None = None,
    scheduler_address: str | None = None,
    output_dir: str = "dask-otel-spans",
    use_global: bool = True,
    metric_series_limit: int | None = None,
    default_service_name: str = names.DEFAULT_SERVICE_NAME,
    resource_attributes: Mapping[str, AttributeValue] | None = None,
    live_records: bool = True,
    delivery: Delivery | None = None,
) -> Providers:
    """Pick the providers: argument, then global SDK provider, then ``OTEL_*``.

    ``metric_series_limit`` is the cardinality limit of the package's instruments in
    a meter provider built here; ``default_service_name`` and
    ``resource_attributes`` go into its resource (:func:`build_resource`);
    ``live_records``: build the logger provider for the records of running spans
    too (:func:`~dask_otel_spans.sdk.logs.live_records_wanted`). The OTLP
    exporters built here hold what they could not deliver in ``delivery`` (started
    here when one of them uses it; None: nothing is held)."""
    environ = os.environ if environ is None else environ
    out = Providers()
    resource = None

    def get_resource() -> Resource:
        nonlocal resource
        if resource is None:
            resource = build_resource(
                environ, scheduler_address, default_service_name=default_service_name,
                attributes=resource_attributes,
            )
        return resource

    out.tracer_provider, out.traces_to = _provider(
        out, "tracer", tracer_provider, global_sdk_tracer_provider() if use_global else None,
        lambda: build_tracer_provider(environ, get_resource(), output_dir, out.health,
                                      delivery))
    if out.tracer_provider in out.built and FILE_EXPORTER in _trace_exporters(environ):
        out.files_dir = output_dir
    try:
        out.meter_provider, out.metrics_to = _provider(
            out, "meter", meter_provider,
            global_sdk_meter_provider() if use_global else None,
            lambda: build_meter_provider(environ, get_resource(), output_dir, out.health,
                                         metric_series_limit, delivery))
        out.exceptions = ExceptionSignals.from_environ(environ)
        global_logs = global_sdk_logger_provider() if use_global else None
        if out.exceptions.logs or (live_records and live_records_wanted(
                environ, out.tracer_provider in out.owned, global_logs is not None)):
            out.logger_provider, out.logs_to = _provider(
                out, "logger", None, global_logs,
                lambda: build_logger_provider(environ, get_resource(), output_dir,
                                              delivery, out.health))
    except Exception:
        for provider in out.owned:
            provider.shutdown()
        raise
    if delivery is not None and delivery.signals:
        delivery.start()
        out.redelivery = delivery
    return out

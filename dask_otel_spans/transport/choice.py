"""Where the export session runs, chosen in one place: in an export child process
(:class:`ChildTransport`: :class:`~dask_otel_spans.transport.sender.ChildSender`
and :class:`~dask_otel_spans.transport.supervisor.ChildSupervisor`) when the providers can be
built from configuration there, else on a thread of the scheduler process
(:class:`~dask_otel_spans.transport.thread.ThreadTransport`). Both take the same messages
and run the same :class:`~dask_otel_spans.export.session.ExportSession`; the plugin never
asks which one it has.

Only the thread transport imports the export side and the OTel SDK, here, when it is
chosen: with the export in the export process the scheduler process imports neither.
"""
from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Container
from typing import TYPE_CHECKING, Protocol

from dask_otel_spans.otelenv import (
    ConfigurationError,
    exporter_names,
    has_global_sdk_providers,
    under_auto_instrumentation,
)
from dask_otel_spans.protocol.figures import ExportFigures
from dask_otel_spans.transport.sender import ChildSender
from dask_otel_spans.transport.spec import PipelineSpec
from dask_otel_spans.transport.supervisor import (
    EXPORT_PROCESS_NICE,
    ChildSupervisor,
    ExportProcessError,
)

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider

    from dask_otel_spans.protocol.events import Message
    from dask_otel_spans.protocol.wire import Destinations

logger = logging.getLogger(__name__)

#: Seconds an export process is given to exit, past its own wait for its exporters,
#: before it is killed
CHILD_EXIT_MARGIN = 5.0


class Transport(Protocol):
    """What the plugin sends the forwarder's messages through."""

    #: where traces and metrics go, in words
    destinations: Destinations

    def send(self, messages: list[Message]) -> None:
        """Queue messages, in order; never blocks."""

    def restarted(self) -> Container[int] | None:
        """When the export side started anew since the last call (it knows no
        span): the places in the scheduler's span dict of the spans handed over so
        far (the plugin forwards the running spans again, and the done ones that
        are not there)."""

    def flush(self, timeout: float, exporters: bool = True) -> bool:
        """Wait until everything sent so far is applied and what is ready handed
        over, and (``exporters``) exported; False on timeout."""

    def stop(self, timeout: float) -> None:
        """Export what was sent, hand over the spans still open, stop."""

    def figures(self) -> ExportFigures:
        """The session's figures (as last reported, from a child)."""


class ChildTransport:
    """The export session in an export child process.

    Parameters
    ----------
    sender:
        The sender to the export process, started (its supervisor launched the
        child)
    """

    def __init__(self, sender: ChildSender):
        self.sender = sender
        self.destinations = {**sender.supervisor.info, "export_process": True}
        self._launches = sender.supervisor.launches

    def send(self, messages: list[Message]) -> None:
        self.sender.send(messages)

    def restarted(self) -> Container[int] | None:
        supervisor = self.sender.supervisor
        if supervisor.launches == self._launches:
            return None
        self._launches = supervisor.launches
        return supervisor.handed_over

    def flush(self, timeout: float, exporters: bool = True) -> bool:
        return self.sender.flush(timeout, exporters)

    def stop(self, timeout: float) -> None:
        # (the child waits ``timeout`` for its exporters itself, then exits)
        self.sender.stop(timeout + CHILD_EXIT_MARGIN)

    def figures(self) -> ExportFigures:
        return self.sender.figures()


def why_export_stays_here(
    spec: PipelineSpec, *, given_providers: bool, use_global: bool
) -> str | None:
    """What keeps export in the scheduler process whatever ``export-process`` says:
    providers that are objects of this process (given, or the global ones), or
    Prometheus on the scheduler's own port; None when nothing does."""
    if given_providers:
        return "given providers"
    if spec.providers_factory:
        return None
    environ = os.environ if spec.environ is None else spec.environ
    if "prometheus" in exporter_names(environ, "OTEL_METRICS_EXPORTER") and (
        not environ.get("OTEL_EXPORTER_PROMETHEUS_PORT")
    ):
        return ("OTEL_METRICS_EXPORTER=prometheus on the scheduler's own /metrics "
                "(set OTEL_EXPORTER_PROMETHEUS_PORT to serve from the export process)")
    if uses_global_providers(use_global):
        return "the process's global providers"
    return None


def uses_global_providers(use_global: bool) -> bool:
    """Whether export goes through the process's global providers: installed, asked
    for, and not the auto-instrumentation launcher's (built from the same ``OTEL_*``:
    the export process builds its own from them instead, and the launcher's, left
    unused in the scheduler process, export nothing of the plugin's twice)."""
    return use_global and has_global_sdk_providers() and not under_auto_instrumentation()


async def open_transport(
    spec: PipelineSpec,
    *,
    tracer_provider: TracerProvider | None = None,
    meter_provider: MeterProvider | None = None,
    use_global: bool = True,
    nthreads_history: list[tuple[float, int]] | None = None,
) -> Transport | None:
    """Start the export session where it is to run; None when no exporter could be
    set up (logged: the plugin stays idle).

    Parameters
    ----------
    spec:
        The settings and how to build the providers from configuration
    tracer_provider, meter_provider:
        Providers given to the plugin (export then stays in this process)
    use_global:
        Whether the process's global SDK providers are used when installed
    nthreads_history:
        The scheduler's ``total_nthreads_history``
    """
    config = spec.config
    setting = config.export_process
    given = tracer_provider is not None or meter_provider is not None
    stays = why_export_stays_here(spec, given_providers=given, use_global=use_global)
    if use_global and has_global_sdk_providers() and under_auto_instrumentation():
        logger.info("dask_otel_spans: under OpenTelemetry auto-instrumentation: "
                    "providers are built from OTEL_* for the plugin (the launcher's "
                    "global providers are left to the rest of the scheduler process)")
    use_global = uses_global_providers(use_global)
    if not given and not use_global:
        try:  # (providers from configuration: a bad value is said once, here)
            spec.check()
        except ConfigurationError as e:
            logger.error("dask_otel_spans: %s; the plugin stays idle: nothing is "
                         "exported until this is fixed", e)
            return None
    if setting is not False and stays is None:
        supervisor = ChildSupervisor(
            spec, nice=EXPORT_PROCESS_NICE, cpu_policy=config.export_process_cpu_policy,
        )
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, supervisor.launch)
        except ExportProcessError as e:
            if e.setup_failed:  # (the scheduler process would fail the same way)
                logger.error("dask_otel_spans: cannot set up exporters (%s); the "
                             "plugin stays idle: nothing is exported", e)
                return None
            logger.log(
                logging.ERROR if setting is True else logging.WARNING,
                "dask_otel_spans: the export process did not start (%s); exporting "
                "in the scheduler process", e,
            )
        else:
            sender = ChildSender(supervisor, budget=config.forward_budget)
            sender.nthreads_history = nthreads_history
            sender.start()
            return ChildTransport(sender)
    elif setting is not False:
        logger.log(
            logging.INFO if setting is True else logging.DEBUG,
            "dask_otel_spans: the export process needs providers built from "
            "configuration (OTEL_* or otel-spans.providers); with %s, spans are "
            "exported in the scheduler process", stays,
        )
    # (the one place the export side is imported in the scheduler process)
    from dask_otel_spans.transport.thread import thread_transport

    return thread_transport(
        spec, tracer_provider=tracer_provider, meter_provider=meter_provider,
        use_global=use_global, nthreads_history=nthreads_history,
        watch_share=setting is False and stays is None)

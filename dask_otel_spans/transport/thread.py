"""The export session on a thread of the scheduler process, imported only where
:func:`~dask_otel_spans.transport.choice.open_transport` chooses it."""
from __future__ import annotations

import logging
from collections.abc import Container
from typing import TYPE_CHECKING

from dask_otel_spans.export.pipeline import ExportPipeline
from dask_otel_spans.export.session import ExportSession
from dask_otel_spans.export.share import ExportShareWatch
from dask_otel_spans.protocol.figures import ExportFigures
from dask_otel_spans.transport.providers import build_providers
from dask_otel_spans.transport.spec import PipelineSpec

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider

    from dask_otel_spans.protocol.events import Message
    from dask_otel_spans.protocol.wire import Destinations

logger = logging.getLogger(__name__)


class ThreadTransport:
    """The export session on a thread of the scheduler process.

    Parameters
    ----------
    session:
        The session, started
    destinations:
        Where traces and metrics go, in words
    """

    def __init__(self, session: ExportSession, destinations: Destinations):
        self.session = session
        self.destinations = destinations

    def send(self, messages: list[Message]) -> None:
        self.session.send(messages)

    def restarted(self) -> Container[int] | None:
        return None

    def flush(self, timeout: float, exporters: bool = True) -> bool:
        return self.session.flush(timeout, exporters)

    def stop(self, timeout: float) -> None:
        self.session.stop(timeout)

    def figures(self) -> ExportFigures:
        return self.session.figures()


def thread_transport(spec: PipelineSpec, *, tracer_provider: TracerProvider | None,
                     meter_provider: MeterProvider | None,
                     use_global: bool, nthreads_history: list[tuple[float, int]] | None,
                     watch_share: bool) -> ThreadTransport | None:
    """The export session on a thread of this process; None when no exporter could
    be set up (logged). ``watch_share``: say once when export takes a noticeable
    share of the process's CPU (it could run in the export process)."""
    try:
        providers = build_providers(
            spec, tracer_provider=tracer_provider, meter_provider=meter_provider,
            use_global=use_global,
        )
        pipeline = ExportPipeline.build(providers, spec.config, spec.environ)
    except Exception as e:
        logger.error("dask_otel_spans: cannot set up exporters (%s: %s); the plugin "
                     "stays idle: nothing is exported", type(e).__name__, e)
        return None
    session = ExportSession(pipeline, spec.config, nthreads_history)
    if watch_share:
        session.share_watch = ExportShareWatch(
            lambda: pipeline.cpu_seconds() + session.cpu_seconds
        )
    session.start()
    return ThreadTransport(session, {
        "traces_to": providers.traces_to, "metrics_to": providers.metrics_to,
        "exceptions_to": providers.exceptions_to, "export_process": False,
    })

"""OpenTelemetry traces and metrics from Dask spans and fine performance metrics.

Client code::

    from dask_otel_spans import span      # instead of: from distributed import span

    with span("Alice's workflow", "data load"):
        df = dd.read_parquet(...).persist()

Scheduler and workers::

    dask scheduler --preload dask_otel_spans
    dask worker --preload dask_otel_spans   # task code inside the span's trace

or ``client.register_plugin(OTelSpansPlugin())`` and
``client.register_plugin(OTelWorkerPlugin())``. Zero-code: ``opentelemetry-instrument
dask scheduler`` (and ``... dask worker``, ``... python app.py``) does both, and makes
``distributed.span`` this ``span`` (``dask_otel_spans.instrumentation``).

Exporters are configured with the standard ``OTEL_*`` variables; with none, OTLP-JSON
lines files are written to ``./dask-otel-spans`` (the scheduler's, and one directory per
worker process below ``./dask-otel-spans/workers``).
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from dask_otel_spans import config as _config  # noqa: F401  (registers defaults)
from dask_otel_spans import names as _names
from dask_otel_spans.client import span, wait_for_export

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from distributed import Client, Scheduler, Worker
    from distributed.core import ErrorMessage, OKMessage, Server

    from dask_otel_spans.scheduler.plugin import OTelSpansPlugin
    from dask_otel_spans.worker.plugin import OTelWorkerPlugin

__version__ = _names.VERSION
__all__ = ["OTelSpansPlugin", "OTelWorkerPlugin", "dask_setup", "report", "span",
           "wait_for_export", "__version__"]

logger = logging.getLogger(__name__)

#: The plugins, imported when first asked for: a client that only uses ``span``
#: loads neither the scheduler side nor the worker side (nor the OTel SDK)
_LAZY = {
    "OTelSpansPlugin": "dask_otel_spans.scheduler.plugin",
    "OTelWorkerPlugin": "dask_otel_spans.worker.plugin",
    "report": "dask_otel_spans.reports.report",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def dask_setup(server: Server | Client) -> Awaitable[ErrorMessage | OKMessage] | None:
    """Preload entry point: ``dask scheduler --preload dask_otel_spans`` and
    ``dask worker --preload dask_otel_spans`` (and the instrumentor's preload).

    Idempotent: a scheduler or worker that has the package's plugin already (preloaded
    twice: ``--preload dask_otel_spans`` and the instrumentor's) keeps that one."""
    from distributed import Scheduler, Worker

    if isinstance(server, Scheduler):
        from dask_otel_spans.scheduler.plugin import OTelSpansPlugin

        if _has_plugin(server, _names.PLUGIN_NAME, OTelSpansPlugin):
            return None
        _log_as_distributed_does()
        server.add_plugin(OTelSpansPlugin())
        return None
    if isinstance(server, Worker):
        from dask_otel_spans.worker.plugin import OTelWorkerPlugin

        if _has_plugin(server, _names.WORKER_PLUGIN_NAME, OTelWorkerPlugin):
            return None
        _log_as_distributed_does()
        return server.plugin_add(OTelWorkerPlugin())
    logger.info(
        "dask_otel_spans: preload is for schedulers and workers; nothing to do on %s",
        type(server).__name__,
    )
    return None


def _has_plugin(server: Scheduler | Worker, name: str, kind: type) -> bool:
    """Whether ``server`` has the package's plugin ``kind`` (under its name or
    another)."""
    plugins = getattr(server, "plugins", None) or {}
    if name in plugins or any(isinstance(p, kind) for p in plugins.values()):
        logger.debug("dask_otel_spans: %s has its plugin already; preloaded twice",
                     type(server).__name__)
        return True
    return False


def _log_as_distributed_does() -> None:
    """Let the package's lines (INFO and up: where data goes, export process or
    not) reach the scheduler's or worker's log as distributed's own do, unless logging was
    configured for the package already."""
    package = logging.getLogger(__name__)
    distributed = logging.getLogger("distributed")
    if package.handlers or package.level != logging.NOTSET or not distributed.handlers:
        return
    for handler in distributed.handlers:
        package.addHandler(handler)
    package.setLevel(logging.INFO)
    package.propagate = False

"""The worker side: :class:`OTelWorkerPlugin` runs task code in its dask span's trace;
task contexts, log correlation and the worker process's providers. Imports nothing
from the scheduler or export sides."""
from __future__ import annotations

from dask_otel_spans.worker.plugin import OTelWorkerPlugin

__all__ = ["OTelWorkerPlugin"]

"""The former path of :mod:`dask_otel_spans.client.state`, kept for what imports it
by this name (``dask_otel_spans.state.scheduler_state``)."""
from __future__ import annotations

from dask_otel_spans.client.state import IDLE, ExportState, scheduler_state

__all__ = ["IDLE", "ExportState", "scheduler_state"]

"""The client side: ``span()`` and what a client asks the scheduler's plugin
(:func:`wait_for_export`). Loads nothing of the scheduler, transport or export sides,
nor the OTel SDK."""
from __future__ import annotations

from dask_otel_spans.client.blocks import NOTICE_TIMEOUT, caller_carrier, span
from dask_otel_spans.client.context import ENVIRONMENT_CARRIERS, context_from_environment
from dask_otel_spans.client.plugin_check import (
    PLUGIN_FIX,
    PluginStatus,
    check_plugin_soon,
    plugin_running,
    plugin_status,
)
from dask_otel_spans.client.state import (
    IDLE,
    ExportState,
    PluginMissing,
    scheduler_state,
    wait_for_export,
)

__all__ = [
    "ENVIRONMENT_CARRIERS", "IDLE", "NOTICE_TIMEOUT", "PLUGIN_FIX", "ExportState",
    "PluginMissing", "PluginStatus", "caller_carrier", "check_plugin_soon",
    "context_from_environment", "plugin_running", "plugin_status", "scheduler_state",
    "span", "wait_for_export",
]

"""The scheduler plugin under test on an in-process cluster: installed exporting to
memory, found on its scheduler; and a task that runs as long as a test needs."""
from __future__ import annotations

from typing import Any

from dask_otel_spans import OTelSpansPlugin, names
from support.providers import MemoryProviders

#: short waits: a span is exported soon after its tasks (the tests' clusters are small);
#: an export process at the scheduler's priority: the default, SCHED_IDLE, waits
#: while every core is busy, as the parallel suite keeps them (its own test sets it)
FAST = dict(export_delay=0.1, idle_timeout=1.0, export_process_cpu_policy="normal")


async def install(c, memory: MemoryProviders, **settings) -> OTelSpansPlugin:
    """Register a plugin exporting to ``memory`` in the scheduler process."""
    plugin = OTelSpansPlugin(
        tracer_provider=memory.tracer_provider,
        meter_provider=memory.meter_provider,
        **{**FAST, **settings},
    )
    await c.register_plugin(plugin)
    return plugin


def plugin_of(s: Any) -> OTelSpansPlugin:
    """The plugin registered on the scheduler ``s``."""
    return s.plugins[names.PLUGIN_NAME]


def tracker_of(plugin: OTelSpansPlugin):
    """The readiness tracker of a plugin that exports in this process."""
    return plugin.transport.session.tracker


def wait_for_event(name: str) -> int:
    """A task that runs until the distributed ``Event`` ``name`` is set (a task that
    stays ``processing`` for as long as a test needs, and no longer)."""
    from distributed import Event

    Event(name).wait()
    return 1

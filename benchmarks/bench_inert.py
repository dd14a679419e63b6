"""Scheduler preload of the benchmark's ``--inert`` variant: a scheduler plugin with the
hooks that ``OTelSpansPlugin`` has, doing nothing in them, and no threads, callbacks or
export process.

Set against the baseline in the same rounds, it measures what a plugin's mere presence
costs the scheduler (distributed calls ``transition`` for every transition of every
task, with its keyword arguments made into a dict per call), apart from what the
plugin does; set against the plugin, the rest.
"""
from __future__ import annotations

from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin


class InertPlugin(SchedulerPlugin):
    """``OTelSpansPlugin``'s hooks, with the same signatures, and no work in them."""

    name = "bench-inert"

    def update_graph(self, scheduler: Any, *, tasks: Any = (),
                     annotations: Any = None, client: str | None = None,
                     **kwargs: Any) -> None:
        pass

    def log_event(self, topic: str, msg: Any, **kwargs: Any) -> None:
        pass

    def remove_client(self, scheduler: Any, client: str, **kwargs: Any) -> None:
        pass

    def transition(self, key: Any, start: str, finish: str, *args: Any,
                   **kwargs: Any) -> None:
        pass


def dask_setup(scheduler: Any) -> None:
    scheduler.add_plugin(InertPlugin())

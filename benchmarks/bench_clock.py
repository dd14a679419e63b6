"""Scheduler preload of every benchmark run, with or without the plugin: notes when
the scheduler saw each dask span's tree done, the reference of the latency figures.

A span's end as the workers report it (``TaskGroup.stop``) is a worker's clock moved by
its estimate of the scheduler's clock offset, taken at its last heartbeat from the
middle of a round trip. When the scheduler's event loop lags, that estimate is off by
up to half the lag, so worker-reported ends can lie a second or more in the
scheduler's future, and a latency measured from them comes out too short (even
negative). The scheduler's own clock at the transition of a span's last task to
``memory`` or ``erred`` has no such error.
"""
from __future__ import annotations

from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin
from distributed.metrics import time

#: dask span id -> scheduler time of the latest task of its tree that finished
DONE_AT: dict[str, float] = {}

_FINISHED = ("memory", "erred")


class SpanDoneClock(SchedulerPlugin):
    """The ``transition`` hook, on every finished task: O(depth of its span)."""

    name = "bench-span-done-clock"

    def __init__(self, scheduler: Any):
        self.tasks = scheduler.tasks
        self.spans = scheduler.extensions["spans"].spans

    def transition(self, key: Any, start: str, finish: str, *args: Any,
                   **kwargs: Any) -> None:
        if finish not in _FINISHED:
            return
        ts = self.tasks.get(key)
        if ts is None:
            return
        node = self.spans.get(ts.group.span_id)
        now = time()
        while node is not None:
            DONE_AT[node.id] = now
            node = node.parent


def dask_setup(scheduler: Any) -> None:
    scheduler.add_plugin(SpanDoneClock(scheduler))

"""Scheduler preload of every benchmark run, with or without the plugin: notes when
the scheduler saw each dask span's tree done (the reference of the latency figures),
and counts the scheduler process's garbage collections and their CPU time.

A span's end as the workers report it (``TaskGroup.stop``) is a worker's clock moved by
its estimate of the scheduler's clock offset, taken at its last heartbeat from the
middle of a round trip. When the scheduler's event loop lags, that estimate is off by
up to half the lag, so worker-reported ends can lie a second or more in the
scheduler's future, and a latency measured from them comes out too short (even
negative). The scheduler's own clock at the transition of a span's last task to
``memory`` or ``erred`` has no such error.

A span opened with ``dask_otel_spans.span`` is not done before its block exits (more
tasks may come): the scheduler's clock when the block's close notice reached it is
noted too, and the latency counts from the later of the two.
"""
from __future__ import annotations

import gc
import threading
import time as _time
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin
from distributed.metrics import time

from dask_otel_spans.names import EVENT_TOPIC

#: dask span id -> scheduler time of the latest task of its tree that finished
DONE_AT: dict[str, float] = {}
#: dask span id -> scheduler time of its client's close notice (its block exited)
CLOSED_AT: dict[str, float] = {}

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

    def log_event(self, topic: str, msg: Any, **kwargs: Any) -> None:
        """A close notice (or a batch of them): the spans each block opened."""
        if topic != EVENT_TOPIC:
            return
        now = time()
        for notice in msg if isinstance(msg, (list, tuple)) else (msg,):
            try:
                ids = notice["ids"]
                for span_id in ids[len(ids) - int(notice["opened"]):]:
                    CLOSED_AT[span_id] = now
            except (KeyError, TypeError, ValueError):
                continue


def pop_done_at(span_id: str) -> tuple[float | None, float | None]:
    """When the scheduler saw a span's tree done, and when it saw the span done: the
    later of that and its close notice (None for either without a record)."""
    tree_done = DONE_AT.pop(span_id, None)
    closed = CLOSED_AT.pop(span_id, None)
    if tree_done is None or closed is None:
        return tree_done, tree_done
    return tree_done, max(tree_done, closed)


#: garbage collections in this process: how many by generation, and the CPU seconds
#: of the threads that ran them
GC = {"collections": [0, 0, 0], "cpu_s": 0.0}
_GC_STARTED: dict[int, float] = {}


def _gc_clock(phase: str, info: dict) -> None:
    thread = threading.get_ident()
    if phase == "start":
        _GC_STARTED[thread] = _time.thread_time()
        return
    started = _GC_STARTED.pop(thread, None)
    if started is not None:
        GC["cpu_s"] += _time.thread_time() - started
    GC["collections"][info["generation"]] += 1


def gc_figures(dask_scheduler: Any = None) -> dict:
    """run_on_scheduler: the garbage collections so far."""
    return {"collections": list(GC["collections"]), "cpu_s": GC["cpu_s"]}


def thread_cpu(dask_scheduler: Any = None) -> dict:
    """run_on_scheduler: CPU seconds of this process's live threads by thread name
    (``MainThread`` runs the event loop), from each thread's CPU-time clock (to the
    nanosecond, where ``/proc``'s figures step by 10 ms); ``process``: the whole
    process (ended threads included); ``process user`` and ``process system``: its
    split as the kernel counts it (in 10 ms ticks)."""
    import psutil

    out: dict[str, float] = {}
    for t in threading.enumerate():
        try:
            cpu = _time.clock_gettime(_time.pthread_getcpuclockid(t.ident))
        except (OSError, TypeError, AttributeError):
            continue
        out[t.name] = out.get(t.name, 0.0) + cpu
    out["process"] = _time.process_time()
    times = psutil.Process().cpu_times()
    out["process user"], out["process system"] = times.user, times.system
    return out


def sender_frames(dask_scheduler: Any) -> int:
    """run_on_scheduler: frames the plugin wrote to its export process so far."""
    return int(export_figures(dask_scheduler).get("frames", 0))


def export_figures(dask_scheduler: Any) -> dict:
    """run_on_scheduler: the plugin's export figures as last reported (its export
    process's garbage collections included); empty without a plugin."""
    plugin = dask_scheduler.plugins.get("otel-spans")
    figures = getattr(plugin, "export_figures", None)
    if figures is not None:
        return figures().flat()
    stats = getattr(plugin, "export_stats", None)  # (before the typed figures)
    return dict(stats()) if stats is not None else {}


def dask_setup(scheduler: Any) -> None:
    gc.callbacks.append(_gc_clock)
    scheduler.add_plugin(SpanDoneClock(scheduler))

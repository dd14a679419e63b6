"""Taps on the workers' heartbeats, which distributed offers no plugin hook for: the
spans extension's per-span metric deltas and the worker-wide ones, seen after
distributed handled them. Each tap is undone at close."""
from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, TypeAlias

from dask_otel_spans import names

if TYPE_CHECKING:
    from distributed.scheduler import Scheduler, WorkerState
    from distributed.spans import SpansSchedulerExtension

#: A heartbeat's span metric deltas ``{(context, span_id, prefix, activity, unit): value}``
SpanDeltas: TypeAlias = dict[tuple[Hashable, ...], float]
#: What takes them (:func:`tap_heartbeats`)
OnSpanDeltas: TypeAlias = Callable[[SpanDeltas], None]
#: What takes a worker heartbeat's result and ``metrics`` (:func:`tap_heartbeats`)
OnWorkerHeartbeat: TypeAlias = Callable[[object, object], None]


def tap_heartbeats(
    ext: SpansSchedulerExtension,
    scheduler: Scheduler,
    on_span_deltas: OnSpanDeltas,
    on_worker_heartbeat: OnWorkerHeartbeat,
) -> list[Callable[[], None]]:
    """Call ``on_span_deltas(data)`` after the spans extension took a heartbeat's
    per-span deltas, and ``on_worker_heartbeat(result, metrics)`` after the scheduler
    handled a worker's heartbeat (:func:`worker_wide_deltas` reads them); return the
    functions that undo the taps.

    The callbacks are held weakly (bound methods of the plugin): a tap whose plugin
    is gone does nothing. They must not raise (the plugin guards its own).
    """
    undo = [_tap_span_heartbeats(ext, weakref.WeakMethod(on_span_deltas))]
    worker_undo = _tap_worker_heartbeats(scheduler,
                                         weakref.WeakMethod(on_worker_heartbeat))
    if worker_undo is not None:
        undo.append(worker_undo)
    return undo


def _tap_span_heartbeats(ext: SpansSchedulerExtension,
                         span_cb: weakref.WeakMethod[OnSpanDeltas]
                         ) -> Callable[[], None]:
    original_span_hb = ext.heartbeat

    @functools.wraps(original_span_hb)
    def span_heartbeat(ws: WorkerState, data: SpanDeltas) -> None:
        original_span_hb(ws, data)
        callback = span_cb()
        if callback is not None and data:
            callback(data)

    ext.heartbeat = span_heartbeat  # type: ignore[method-assign]

    def undo_span_hb() -> None:
        if ext.__dict__.get("heartbeat") is span_heartbeat:
            bound_to = getattr(original_span_hb, "__self__", None)
            # (the class's method: the instance's attribute goes)
            if bound_to is not None and bound_to is ext:
                del ext.heartbeat
            else:
                ext.heartbeat = original_span_hb  # type: ignore[method-assign]

    return undo_span_hb


def _tap_worker_heartbeats(scheduler: Scheduler,
                           worker_cb: weakref.WeakMethod[OnWorkerHeartbeat]
                           ) -> Callable[[], None] | None:
    original_worker_hb = scheduler.handlers.get("heartbeat_worker")
    if original_worker_hb is None:
        return None

    @functools.wraps(original_worker_hb)
    def heartbeat_worker(*args: object, **kwargs: object) -> object:
        result = original_worker_hb(*args, **kwargs)
        callback = worker_cb()
        if callback is not None:
            callback(result, kwargs.get("metrics"))
        return result

    scheduler.handlers["heartbeat_worker"] = heartbeat_worker

    def undo_worker_hb() -> None:
        if scheduler.handlers.get("heartbeat_worker") is heartbeat_worker:
            scheduler.handlers["heartbeat_worker"] = original_worker_hb

    return undo_worker_hb


def worker_wide_deltas(result: object, metrics: object) -> dict[Hashable, float]:
    """The deltas of an accepted heartbeat (``result`` status OK) that belong to no
    span (contexts without a span id); empty for anything else."""
    if not isinstance(result, dict) or result.get("status") != "OK":
        return {}
    if not isinstance(metrics, dict):
        return {}
    digests = metrics.get("digests_total_since_heartbeat") or {}
    if not isinstance(digests, dict):
        return {}
    return {
        k: v
        for k, v in digests.items()
        if isinstance(k, tuple) and k and k[0] not in names.CONTEXTS_WITH_SPAN_ID
    }

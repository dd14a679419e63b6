"""The workers' heartbeats as an event to wait for: the span metrics a worker
recorded reach the scheduler with its next heartbeat, at whatever time the load
allows, so a test that asserts them waits until the scheduler holds what the workers
recorded (polled with a deadline), not for a grace period or a fixed time."""
from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Collection, Hashable, Iterable, Mapping
from typing import Any

Key = tuple[Hashable, ...]


def recorded_span_metrics(digests_total: Mapping[Hashable, float],
                          span_ids: Collection[str]) -> dict[Key, float]:
    """What a worker recorded for the spans ``span_ids`` (its
    ``Worker.digests_total``, whose span keys carry the span id second), keyed as
    the scheduler's ``Span.cumulative_worker_metrics``: without the span id."""
    out: defaultdict[Key, float] = defaultdict(float)
    for key, value in list(digests_total.items()):
        if isinstance(key, tuple) and len(key) > 2 and key[1] in span_ids:
            out[key[:1] + key[2:]] += value
    return dict(out)


def worker_span_metrics(dask_worker: Any, span_id: str) -> dict[Key, float]:
    """:func:`recorded_span_metrics` of one span, for ``Client.run`` on real
    workers."""
    return recorded_span_metrics(dask_worker.digests_total, {span_id})


def holds_all(got: Mapping[Key, float], *recorded: Mapping[Key, float]) -> bool:
    """Whether ``got`` (a span's ``cumulative_worker_metrics``) holds every metric
    the workers ``recorded`` (one mapping each), and there is one."""
    total: defaultdict[Key, float] = defaultdict(float)
    for one in recorded:
        for key, value in one.items():
            total[key] += value
    return bool(total) and all(
        math.isclose(got.get(key, 0), value, rel_tol=1e-9, abs_tol=1e-12)
        for key, value in total.items())


def span_metrics_in(s: Any, workers: Iterable[Any], span_id: str) -> bool:
    """Whether the scheduler ``s`` holds every span metric the in-process
    ``workers`` (``gen_cluster``'s) recorded for the span ``span_id`` and the spans
    below it: their heartbeats since came."""
    spans = s.extensions["spans"].spans
    if span_id not in spans:
        return False
    ids = {sp.id for sp in spans[span_id].traverse_spans()}
    return holds_all(spans[span_id].cumulative_worker_metrics,
                     *(recorded_span_metrics(w.digests_total, ids) for w in workers))

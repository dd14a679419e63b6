"""The heartbeat taps' pure part: which deltas of a worker's heartbeat are
worker-wide (no cluster)."""
from __future__ import annotations

import pytest

from dask_otel_spans.scheduler.heartbeats import worker_wide_deltas

OK = {"status": "OK"}


def test_only_the_deltas_of_no_span_are_worker_wide():
    digests = {
        ("execute", "span-1", "inc", "thread-cpu", "seconds"): 1.0,
        ("get-data", "network", "seconds"): 2.0,
        ("gather-dep", "decompress", "seconds"): 3.0,
    }
    deltas = worker_wide_deltas(OK, {"digests_total_since_heartbeat": digests})
    assert deltas == {("get-data", "network", "seconds"): 2.0,
                      ("gather-dep", "decompress", "seconds"): 3.0}


@pytest.mark.parametrize("result, metrics", [
    ({"status": "missing"}, {"digests_total_since_heartbeat": {("get-data", "s"): 1.0}}),
    (None, {"digests_total_since_heartbeat": {("get-data", "s"): 1.0}}),
    (OK, None),
    (OK, {"digests_total_since_heartbeat": "not a mapping"}),
    (OK, {"digests_total_since_heartbeat": {"not a tuple": 1.0, (): 2.0}}),
])
def test_a_heartbeat_that_was_refused_or_is_malformed_has_no_worker_deltas(result, metrics):
    assert worker_wide_deltas(result, metrics) == {}

"""The benchmark's delayed and nested workloads submit one collection each (so that
distributed's per-collection copies do not swamp the baseline), with every task in a
span of the workload; their ``-list`` forms submit a list of collections."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
from distributed import Client, LocalCluster

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
import bench_scheduler  # noqa: E402


@pytest.fixture(scope="module")
def client():
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                      dashboard_address=":0") as cluster, Client(cluster) as c:
        yield c


def spans_and_collections(dask_scheduler) -> dict[str, tuple[tuple[str, ...], int]]:
    """Span id -> (name, collections in its metadata), for the spans with tasks."""
    ext = dask_scheduler.extensions["spans"]
    out = {}
    for span in ext.spans.values():
        if span.groups:
            metadata = span._metadata or {"collections": []}
            out[span.id] = (tuple(span.name), len(metadata["collections"]))
    return out


def run_workload(client: Client, name: str, shape: tuple[int, ...]):
    """Tasks the workload ran, and {span name: collections} of the spans it made."""
    before = set(client.run_on_scheduler(spans_and_collections))
    tasks = bench_scheduler.ALL_WORKLOADS[name](client, *shape)
    after = client.run_on_scheduler(spans_and_collections)
    return tasks, dict(v for k, v in after.items() if k not in before)


def test_nested_workload_submits_one_collection(client):
    tasks, spans = run_workload(client, "nested", (2, 2, 3))
    assert tasks == 12
    assert set(spans.values()) == {1}  # each span copied a list of one collection
    assert ("l1-gather",) in spans  # the task making the list has its own span
    assert ("default",) not in spans  # every task is in a span of the workload


def test_delayed_workload_submits_one_collection(client):
    tasks, spans = run_workload(client, "delayed", (3, 4))
    assert tasks == 12
    assert set(spans.values()) == {1}
    assert ("delayed", "gather") in spans
    assert ("default",) not in spans


def test_nested_list_workload_submits_a_collection_per_leaf_span(client):
    tasks, spans = run_workload(client, "nested-list", (2, 2, 3))
    assert tasks == 12
    assert set(spans.values()) == {12}  # the list of all 12, copied into each span


def test_nested_x10_workload_puts_ten_tasks_in_each_leaf_span(client):
    def leaf_tasks(dask_scheduler) -> dict[str, int]:
        ext = dask_scheduler.extensions["spans"]
        return {s.id: sum(sum(tg.states.values()) for tg in s.groups)
                for s in ext.spans.values() if s.name[-1].startswith("l3-")}

    before = set(client.run_on_scheduler(leaf_tasks))
    tasks = bench_scheduler.ALL_WORKLOADS["nested-x10"](client, 2, 2, 3)
    counts = [n for k, n in client.run_on_scheduler(leaf_tasks).items() if k not in before]
    assert tasks == 120
    assert counts == [10] * 12

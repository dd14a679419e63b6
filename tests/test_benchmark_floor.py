"""The floor benchmark runs the plugin and a forwarding-only plugin on real clusters
and reports both per span."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
import bench_floor  # noqa: E402

#: 1 x 1 x 2 leaf spans, their 2 ancestors and the span of the gather
SPANS = 5


@pytest.fixture(scope="module")
def one_run():
    """The figures of one nested run of each variant, each on its own cluster."""
    return {variant: bench_floor.measure(variant, 1, 1, 1, 2)[0]
            for variant in bench_floor.VARIANTS}


@pytest.mark.parametrize("variant", bench_floor.VARIANTS)
def test_a_run_counts_every_span_of_the_workload(one_run, variant):
    assert one_run[variant]["spans"] == SPANS


@pytest.mark.parametrize("variant", bench_floor.VARIANTS)
def test_a_run_reports_the_cpu_per_span_of_both_places(one_run, variant):
    run = one_run[variant]
    assert set(bench_floor.FIGURES) <= set(run)
    assert run["loop"] > 0 and run["sender"] > 0
    assert run["own"] == pytest.approx(run["loop"] + run["sender"])


@pytest.mark.parametrize("variant", bench_floor.VARIANTS)
def test_a_run_reports_the_bytes_sent_per_span(one_run, variant):
    assert one_run[variant]["bytes"] > 100


def test_the_floor_forwards_every_done_task_group_once(one_run):
    """The two leaf spans' groups and the gather's."""
    assert one_run["floor"]["groups"] == 3


def test_an_unknown_variant_is_refused():
    with pytest.raises(ValueError, match="variant"):
        bench_floor.measure("inert", 1, 1, 1, 1)


def test_the_forwarded_events_hold_what_the_scheduler_knows_of_every_span(
    tmp_path, monkeypatch
):
    """What the floor forwards is enough for an export process to rebuild every span's
    snapshot (name, parent, groups' figures, metrics summed from the deltas): the
    floor forwards what the redesign needs, not only less."""
    import bench_scheduler as bench

    recording = tmp_path / "forwarded.bin"
    monkeypatch.setenv(bench_floor.RECORD_VARIABLE, str(recording))
    cluster = bench.Cluster(False, 2, 2, preload="bench_floor")
    try:
        client = cluster.client
        bench.futures_workload(client, 2, 3)
        bench.nested_workload(client, 1, 2, 3)
        deadline = time.monotonic() + 30
        while True:
            on_scheduler = client.run_on_scheduler(bench_floor.spans_on_scheduler)
            rebuilt = bench_floor.rebuild_spans(bench_floor.read_recording(str(recording)))
            # (every span with tasks has its metrics once the workers' heartbeats
            # with them are in)
            metered = all(s["metrics"] for s in on_scheduler.values() if s["groups"])
            if (metered and rebuilt == on_scheduler) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    finally:
        cluster.close()
    # the futures' 2 spans, nested's 6 leaves, 3 ancestors and its gather's span
    assert len(on_scheduler) == 12
    assert all(s["metrics"] for s in on_scheduler.values() if s["groups"])
    assert rebuilt == on_scheduler

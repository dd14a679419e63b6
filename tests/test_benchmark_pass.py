"""The pass replay benchmark drives the plugin's real hooks and passes to the end."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
from bench_pass import PHASES, close_notices, measure, replay  # noqa: E402


def test_the_notices_are_those_of_every_block_in_exit_order():
    notices, leaves = close_notices(2, 2, 3, 1.0)
    assert len(leaves) == 12
    assert len(notices) == 12 + 4 + 2
    # a leaf's block exits before its parent's, which exits before the root's
    assert [len(n["ids"]) for n in notices[:5]] == [3, 3, 3, 2, 3]
    assert notices[-1]["ids"] == [leaves[-1][0][0]]


def test_a_replay_hands_every_span_over_and_times_each_phase():
    cpu, spans = replay(2, 2, 3)
    assert spans == 12 + 4 + 2
    assert all(cpu[phase] > 0 for phase in PHASES)


def test_the_measure_reports_per_span_figures_by_phase():
    result = measure(2, 2, 3, 2)
    assert result["spans"] == 18
    assert set(result["by_phase_median"]) == set(PHASES)
    assert 0 < result["best"] <= result["median"]


def test_a_replay_gives_the_plugin_its_wall_clock_back():
    import dask_otel_spans.plugin as plugin_module

    wall_clock = plugin_module.time
    replay(1, 1, 2)
    assert plugin_module.time is wall_clock

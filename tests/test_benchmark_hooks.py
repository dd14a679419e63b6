"""The hook microbenchmark measures the plugin's real ``transition`` path."""
from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
from bench_hooks import FINISHED_KWARGS, isolated_plugin, main  # noqa: E402


def test_the_isolated_plugin_settles_the_span_of_a_finished_task():
    # the timed call does the hook's work (a stale stand-in would time an early return)
    plugin = isolated_plugin("snapshots")
    plugin.transition("key", "processing", "memory", stimulus_id="s", **FINISHED_KWARGS)
    assert plugin._settled == {"a-span-id"}


def test_the_isolated_forwarding_plugin_touches_the_group_of_a_finished_task():
    plugin = isolated_plugin("forwarding")
    plugin.transition("key", "processing", "memory", stimulus_id="s", **FINISHED_KWARGS)
    assert plugin._forwarder.touched == {plugin._tasks["key"].group}
    assert plugin._settled == set()


def test_the_hook_benchmark_reports_a_cost_per_task_for_both_paths_and_a_no_op(capsys):
    assert main(["--calls", "2000", "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    per_task = re.findall(r"per task \(these 5 transitions\): (-?[0-9.]+) µs", out)
    assert len(per_task) == 3
    assert "forwarding (the default)" in out and "snapshots" in out

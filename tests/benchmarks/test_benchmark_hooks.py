"""The hook and worker microbenchmarks run on real plugins and report a cost per task."""
from __future__ import annotations

import re
import sys

import pytest
from support.paths import BENCHMARKS

sys.path.insert(0, str(BENCHMARKS))
from bench_hooks import main


@pytest.mark.cluster  # (an in-process scheduler)
def test_the_hook_benchmark_reports_a_cost_per_task_for_the_plugin_and_a_no_op(capsys):
    assert main(["--calls", "2000", "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    per_task = re.findall(r"per task \(these 5 transitions\): (-?[0-9.]+) µs", out)
    assert len(per_task) == 2
    assert "OTelSpansPlugin.transition" in out and "a no-op hook" in out


def test_the_worker_benchmark_reports_the_plugin_cost_per_task_and_per_record(capsys):
    from bench_worker import main as worker_main

    assert worker_main(["--parts", "micro", "--calls", "500", "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"the plugin's work per task: -?[0-9.]+ µs", out)
    assert re.search(r"per log record made: -?[0-9.]+ µs", out)


def test_the_zero_code_benchmark_reports_the_client_and_link_costs(capsys):
    from bench_zero_code import main as zero_code_main

    assert zero_code_main(["--parts", "micro", "--calls", "500", "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    for case in ("no span current", "a span current", "a span and baggage"):
        assert re.search(rf"{case} +-?[0-9.]+ µs", out), out
    assert re.search(r"one-task bare graph -?[0-9.]+ µs", out)
    assert re.search(r"128 links [0-9]+ µs, without [0-9]+ µs", out)


def test_the_writer_benchmark_reports_both_paths_per_dask_span(capsys):
    from bench_writers import main as writers_main

    assert writers_main(["--spans", "200", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    for writer in ("api", "direct"):
        assert re.search(rf"{writer}: [0-9.]+ µs of CPU per one-task dask span", out), out
    assert re.search(r"direct / api: [0-9.]+", out)


def test_the_tick_benchmark_reports_a_cost_per_group_handled_and_swept(capsys):
    from bench_tick import main as tick_main

    assert tick_main(["--groups", "20", "--ticks", "5", "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    for case in ("handled", "sweep"):
        assert re.search(rf"{case}: -?[0-9.]+ µs per group per tick", out), out

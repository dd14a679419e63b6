"""The hook microbenchmark runs on a real plugin and reports a cost per task."""
from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
from bench_hooks import main  # noqa: E402


def test_the_hook_benchmark_reports_a_cost_per_task_for_the_plugin_and_a_no_op(capsys):
    assert main(["--calls", "2000", "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    per_task = re.findall(r"per task \(these 5 transitions\): (-?[0-9.]+) µs", out)
    assert len(per_task) == 2
    assert "OTelSpansPlugin.transition" in out and "a no-op hook" in out

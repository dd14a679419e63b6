"""The benchmark's --quick mode runs and reports every part (no speed asserted: a
figure may be any number, only its presence and shape are checked)."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest
from support.paths import BENCHMARKS

BENCH = BENCHMARKS / "bench_scheduler.py"
NUMBER = r"-?[0-9]+(?:\.[0-9]+)?"


@pytest.mark.cluster  # (the benchmark's scheduler and workers)
def test_quick_benchmark_reports_every_part():
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--export-process", "--workloads",
         "interactive", "--workers", "1"],
        capture_output=True, text=True, timeout=400,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    for heading in ("1. throughput", "2. event-loop cost", "3. plugin memory",
                    "4. latency", "5. export cost"):
        assert heading in out
    for label in ("tasks/s", "CPU s/task", "tree CPU", "CPU less GC", "loop s/task",
                  "workers CPU", "adj. CPU", "own CPU", "export CPU"):
        assert re.search(rf"interactive  {label:12s} median {NUMBER}", out), label
    # the plugin's own CPU was read where it runs, by place
    assert re.search(rf"by place: event loop {NUMBER} s .*sender thread {NUMBER} s "
                     rf".*export process {NUMBER} s", out)
    # every span the plugin handed over reached the exporter, and was timed
    latency = re.search(rf"([0-9]+) spans: median {NUMBER} s, p99", out)
    handed = re.search(r"readiness checks per run \(median\) [0-9]+ for ([0-9]+) spans",
                       out)
    assert latency and handed and int(latency.group(1)) == int(handed.group(1)) > 0
    # three memory checkpoints, both processes, and a verdict on growth
    assert len(re.findall(r"after +[0-9]+ emitted spans: .* export process", out)) == 3
    assert re.search(r"growth in the scheduler process: .*: (yes|NO)", out)

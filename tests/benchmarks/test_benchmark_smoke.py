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
QUICK = [sys.executable, str(BENCH), "--quick", "--export-process", "--workloads",
         "interactive", "--workers", "1"]


@pytest.fixture(scope="module")
def quick_run() -> dict[str, str]:
    """What a --quick run printed, by part: its throughput parts (1, 2 and 4: real
    scheduler and worker processes) and its in-process parts (3 and 5) run at the same
    time, as two benchmark processes (each part waits on processes, grace periods
    and heartbeats far more than it computes: one after the other took twice as
    long)."""
    runs = {
        parts: subprocess.Popen([*QUICK, "--parts", parts], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        for parts in ("throughput", "memory,export")
    }
    out = {}
    try:
        for parts, proc in runs.items():
            stdout, stderr = proc.communicate(timeout=400)
            assert proc.returncode == 0, f"--parts {parts}\n{stdout[-3000:]}{stderr[-3000:]}"
            out[parts] = stdout
    finally:
        for proc in runs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return out


@pytest.mark.cluster  # (the benchmark's scheduler and workers)
def test_quick_benchmark_reports_throughput_event_loop_cost_and_latency(quick_run):
    out = quick_run["throughput"]
    for heading in ("1. throughput", "2. event-loop cost", "4. latency"):
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


@pytest.mark.cluster  # (the plugin's export process)
def test_quick_benchmark_reports_memory_and_export_cost(quick_run):
    out = quick_run["memory,export"]
    for heading in ("3. plugin memory", "5. export cost"):
        assert heading in out
    # three memory checkpoints, both processes, and a verdict on growth
    assert len(re.findall(r"after +[0-9]+ emitted spans: .* export process", out)) == 3
    assert re.search(r"growth in the scheduler process: .*: (yes|NO)", out)

"""The benchmark's --quick mode runs and produces every figure (no speed asserted)."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).parent.parent / "benchmarks" / "bench_scheduler.py"


def test_quick_benchmark_produces_all_figures():
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick"],
        capture_output=True, text=True, timeout=400,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    for heading in ("1. throughput", "2. event-loop cost", "3. plugin memory",
                    "4. latency", "5. export cost"):
        assert heading in out
    for workload in ("futures", "delayed", "nested", "big-graph"):
        assert f"{workload:12s} tasks/s      median" in out
        assert f"{workload:12s} CPU s/task   median" in out
        less_gc = re.search(rf"{workload:12s} CPU less GC  median ([0-9.]+)", out)
        assert less_gc and float(less_gc.group(1)) > 0
        loop = re.search(rf"{workload:12s} loop s/task  median ([0-9.]+)", out)
        assert loop and float(loop.group(1)) > 0  # the main thread's CPU was read
        gc_line = re.search(rf"{workload:12s} GC CPU       ([0-9.]+) / ([0-9.]+)", out)
        assert gc_line  # the collections of both sides were counted
        own = re.search(rf"{workload:12s} own CPU      median ([0-9.]+)", out)
        assert own and float(own.group(1)) > 0  # the plugin's own CPU was attributed
        # the control (the workers' CPU) was read on both sides, and divided out
        control = re.search(rf"{workload:12s} workers CPU  median ([0-9.]+)", out)
        assert control and float(control.group(1)) > 0
        assert re.search(rf"{workload:12s} adj. CPU     median [0-9.]+", out)
    assert "longest single call" in out
    own = re.search(r"less the garbage collections it ran ([0-9.]+) ms", out)
    assert own and float(own.group(1)) > 0  # the GC-free figure was measured
    assert out.count("emitted spans:") == 3
    waited = re.search(r"of which done to hand-over .*futures median ([0-9.]+) s", out)
    assert waited and float(waited.group(1)) > 0  # the plugin's wait was recorded
    queued = re.search(r"and hand-over to exporter .*futures median ([0-9.]+) s", out)
    assert queued and float(queued.group(1)) > 0  # hand-over times were recorded
    # latencies from when the scheduler saw each span done (bench_clock), which
    # matched the exported spans
    skew = re.search(r"span ends as the workers reported them, less when the scheduler "
                     r"saw the span done: median ([-+][0-9.]+) s", out)
    assert skew
    latency = re.search(r"([0-9]+) spans: median (-?[0-9.]+) s, p99", out)
    assert latency and int(latency.group(1)) > 0 and float(latency.group(2)) > 0
    checks = re.search(r"readiness checks per run \(median\) ([0-9]+) for ([0-9]+) spans", out)
    assert checks and int(checks.group(1)) > 0 and int(checks.group(2)) > 0
    sums = re.search(r"metric updates per run \(median\) ([0-9]+), handed to the OTel SDK as "
                     r"([0-9]+) counter adds", out)
    assert sums and 0 < int(sums.group(2)) <= int(sums.group(1))


def test_quick_benchmark_with_the_export_process_produces_its_figures():
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--parts", "throughput,memory",
         "--workloads", "futures,nested", "--export-process"],
        capture_output=True, text=True, timeout=400,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "plugin with its export process" in out
    for workload in ("futures", "nested"):
        moved = re.search(rf"{workload:12s} export CPU   median ([0-9.]+)", out)
        assert moved and float(moved.group(1)) > 0  # the export process's CPU was read
        # the plugin's own CPU per span it handed over, next to the baseline's per task
        per_span = re.search(rf"{workload:12s} own µs/span  median ([0-9.]+) .*; "
                             r"baseline CPU ([0-9]+) µs/task", out)
        assert per_span and float(per_span.group(1)) > 0 and int(per_span.group(2)) > 0
    child = re.search(r"export process ([0-9.]+) s", out)
    assert child and float(child.group(1)) > 0  # its own figure, reported to the plugin
    # latencies travel back from the export process through its records file
    latency = re.search(r"([0-9]+) spans: median ([0-9.]+) s", out)
    assert latency and int(latency.group(1)) > 0
    # the export process reports its memory (tracemalloc on) at each checkpoint
    memory = re.findall(r"emitted spans: .* export process ([0-9.]+) MiB traced, "
                        r"([0-9.]+) MiB resident", out)
    assert len(memory) == 3
    assert all(float(traced) > 0 and float(resident) > 0 for traced, resident in memory)


def test_quick_benchmark_runs_the_wide_workload_when_named():
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--workloads", "wide", "--parts",
         "throughput", "--export-process"],
        capture_output=True, text=True, timeout=400,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert f"{'wide':12s} tasks/s      median" in out
    own = re.search(r"less the garbage collections it ran ([0-9.]+) ms", out)
    assert own and float(own.group(1)) > 0
    latency = re.search(r"by workload: .*wide median ([0-9.]+) s max ([0-9.]+) s \(([0-9]+)\)",
                        out)
    assert latency and int(latency.group(3)) == 201  # the parent and its 200 children


def test_quick_benchmark_runs_the_plugin_of_another_tree_against_the_same_baselines(
    tmp_path,
):
    """--against TREE runs that tree's plugin in the same rounds as this one's, each
    reported on its own with the code it ran."""
    other = tmp_path / "other"
    shutil.copytree(BENCH.parent.parent / "dask_otel_spans", other / "dask_otel_spans")
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--workloads", "nested", "--parts",
         "throughput", "--export-process", "--against", str(other)],
        capture_output=True, text=True, timeout=400,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    sections = out.split("== ")[1:]
    assert len(sections) == 2
    root = BENCH.resolve().parent.parent
    assert f"plugin code from {root / 'dask_otel_spans'}" in sections[0]  # this tree's
    assert f"from {other} ==" in sections[1]
    assert f"plugin code from {other / 'dask_otel_spans'}" in sections[1]
    for section in sections:
        own = re.search(rf"{'nested':12s} own CPU      median ([0-9.]+)", section)
        assert own and float(own.group(1)) > 0


def test_quick_benchmark_with_an_inert_plugin_reports_its_ratios_apart():
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--parts", "throughput",
         "--workloads", "futures", "--export-process", "--inert"],
        capture_output=True, text=True, timeout=400,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    # the plugin's report, then the inert plugin's, each with its own ratios
    plugin_part, _, inert_part = out.partition("== an inert plugin")
    assert "== plugin with its export process" in plugin_part
    for part in (plugin_part, inert_part):
        cpu = re.search(r"futures      CPU s/task   median ([0-9.]+)", part)
        assert cpu and float(cpu.group(1)) > 0
    # the inert plugin has no figures of its own: no own CPU, no latency
    assert "own CPU" in plugin_part and "own CPU" not in inert_part
    # its lines are headed as the inert plugin's, not as the plugin's
    assert "CPU seconds per task, inert plugin / baseline" in inert_part
    assert "4. latency" in plugin_part and "4. latency" not in inert_part
    assert "1. throughput, inert plugin / baseline" in inert_part

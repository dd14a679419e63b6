"""The benchmark reads another process's CPU finer than psutil's clock ticks."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
from bench_scheduler import process_cpu_seconds  # noqa: E402

#: burns about 2 ms of CPU (a fifth of a clock tick) for each line it reads
BURNER = """
import sys, time
for line in sys.stdin:
    end = time.thread_time() + 0.002
    while time.thread_time() < end:
        pass
    print("burnt", flush=True)
"""


@pytest.fixture
def burner():
    proc = subprocess.Popen([sys.executable, "-c", BURNER], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    yield proc
    proc.kill()
    proc.wait()


def _burn_once(proc: subprocess.Popen) -> None:
    proc.stdin.write("go\n")
    proc.stdin.flush()
    assert proc.stdout.readline() == "burnt\n"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a Linux clock id")
def test_another_process_cpu_is_read_below_a_clock_tick(burner):
    _burn_once(burner)  # past the interpreter's start-up
    process = psutil.Process(burner.pid)
    before = process_cpu_seconds(process)
    _burn_once(burner)
    moved = process_cpu_seconds(process) - before
    # psutil's ticks (10 ms) would read 0 or 0.01 here
    assert 0.0015 < moved < 0.008


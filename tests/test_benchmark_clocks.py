"""The benchmark's clocks: another process's CPU finer than psutil's clock ticks, and
when the scheduler saw a span done (its tree, or its close notice if later)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
import bench_clock  # noqa: E402
from bench_scheduler import process_cpu_seconds  # noqa: E402

from dask_otel_spans.names import EVENT_TOPIC  # noqa: E402

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


@pytest.fixture
def span_clock():
    bench_clock.DONE_AT.clear()
    bench_clock.CLOSED_AT.clear()
    yield bench_clock.SpanDoneClock.__new__(bench_clock.SpanDoneClock)
    bench_clock.DONE_AT.clear()
    bench_clock.CLOSED_AT.clear()


def test_a_span_closed_after_its_tasks_counts_as_done_at_its_close_notice(span_clock):
    bench_clock.DONE_AT.update({"outer": 10.0, "inner": 10.0})
    # an inner block's notice names its parent too, but closes only what it opened
    span_clock.log_event(EVENT_TOPIC, [{"ids": ["outer", "inner"], "opened": 1},
                                       {"ids": ["outer"], "opened": "x"}])
    assert "outer" not in bench_clock.CLOSED_AT  # the malformed notice is skipped
    closed = bench_clock.CLOSED_AT["inner"]
    assert closed > 10.0
    assert bench_clock.pop_done_at("inner") == (10.0, closed)
    assert bench_clock.pop_done_at("outer") == (10.0, 10.0)  # no notice: its tree


def test_a_span_closed_before_its_tasks_finished_counts_as_done_with_its_tree(span_clock):
    span_clock.log_event(EVENT_TOPIC, {"ids": ["a"], "opened": 1})
    span_clock.log_event("another topic", {"ids": ["b"], "opened": 1})
    assert set(bench_clock.CLOSED_AT) == {"a"}
    tree_done = bench_clock.CLOSED_AT["a"] + 5
    bench_clock.DONE_AT["a"] = tree_done
    assert bench_clock.pop_done_at("a") == (tree_done, tree_done)
    assert bench_clock.pop_done_at("a") == (None, None)  # each record is read once

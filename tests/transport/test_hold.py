"""Export work waits for a busy event loop (:class:`BusyLoopHold`), at most a stretch
at a time; a flush or a stop never waits."""
from __future__ import annotations

import threading
import time
import uuid

import pytest
from conftest import start_sender
from support.polling import wait_for

from dask_otel_spans.sdk.otlpjson import read_spans
from dask_otel_spans.transport.hold import BusyLoopHold


class Clocks:
    """A wall clock and an event-loop thread's CPU clock, moved by hand."""

    def __init__(self) -> None:
        self.wall = 100.0
        self.loop = 0.0

    def run(self, seconds: float, share: float) -> None:
        """``seconds`` of wall time pass, the loop running ``share`` of them."""
        self.wall += seconds
        self.loop += seconds * share

    def hold(self, longest: float) -> BusyLoopHold:
        return BusyLoopHold(lambda: self.loop, longest, clock=lambda: self.wall)


@pytest.fixture
def clocks() -> Clocks:
    return Clocks()


def test_an_idle_loop_is_not_waited_for(clocks):
    hold = clocks.hold(0.5)
    for _ in range(5):
        clocks.run(0.06, 0.2)
        assert hold.holding() is False
    assert hold.stretches == 0


def test_a_busy_loop_is_waited_for_at_most_the_longest_stretch(clocks):
    hold = clocks.hold(0.5)
    said = []
    for _ in range(12):  # (0.72 s of a loop that runs 90 % of the time)
        clocks.run(0.06, 0.9)
        said.append(hold.holding())
    # busy from the first look; the stretch runs out 0.5 s after it (10th look)
    assert said == [True] * 9 + [False] * 3
    hold.released()
    assert hold.held_seconds == pytest.approx(0.72 - 0.06, abs=1e-9)


def test_after_the_work_went_out_a_new_stretch_begins(clocks):
    hold = clocks.hold(0.5)
    for _ in range(10):
        clocks.run(0.06, 1.0)
        hold.holding()
    hold.released()  # (the sender wrote its batch)
    clocks.run(0.06, 1.0)
    assert hold.holding() is True
    assert hold.stretches == 2


def test_a_stretch_ends_when_the_loop_goes_idle(clocks):
    hold = clocks.hold(5.0)
    clocks.run(0.06, 1.0)
    assert hold.holding() is True
    clocks.run(0.2, 1.0)
    assert hold.holding() is True
    clocks.run(0.06, 0.1)
    assert hold.holding() is False
    assert hold.held_seconds == pytest.approx(0.26)


def test_looks_at_the_loop_no_more_often_than_its_window(clocks):
    reads = []

    def loop_cpu() -> float:
        reads.append(clocks.wall)
        return clocks.loop

    hold = BusyLoopHold(loop_cpu, 0.5, clock=lambda: clocks.wall)
    for _ in range(100):
        clocks.run(0.001, 1.0)
        hold.holding()
    assert len(reads) == 1 + 2  # (at the start, then after each 50 ms)


def test_a_loop_clock_that_cannot_be_read_turns_the_hold_off(clocks):
    def gone() -> float:
        if clocks.wall > 100.1:
            raise OSError("no such thread")
        return clocks.loop

    hold = BusyLoopHold(gone, 0.5, clock=lambda: clocks.wall)
    clocks.run(0.06, 1.0)
    assert hold.holding() is True
    clocks.run(0.06, 1.0)
    assert hold.holding() is False
    clocks.run(0.06, 1.0)
    assert hold.holding() is False


def test_no_longest_stretch_never_holds(clocks):
    hold = clocks.hold(0.0)
    clocks.run(0.06, 1.0)
    assert hold.holding() is False


def test_the_hold_reads_the_cpu_clock_of_the_loops_thread():
    """The real clocks: another thread sees this thread busy while it spins, and
    idle once it sleeps."""
    hold = BusyLoopHold.of_thread(threading.get_ident(), 5.0)
    said: dict[str, list[bool]] = {"spin": [], "sleep": []}
    phase = ["spin"]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            said[phase[0]].append(hold.holding())
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        deadline = time.monotonic() + 10
        while not any(said["spin"]) and time.monotonic() < deadline:
            pass  # (spinning: this thread's CPU clock runs with the wall clock)
        phase[0] = "sleep"
        time.sleep(0.3)
    finally:
        done.set()
        watcher.join()
    assert said["spin"][-1] is True
    assert said["sleep"][-1] is False


def always_busy(longest: float) -> BusyLoopHold:
    """A hold on a loop that runs all the time."""
    return BusyLoopHold(time.monotonic, longest)


def notice(name: str) -> tuple:
    """The close notice of a one-level block that sent no task."""
    now = time.time()
    msg = {"ids": [str(uuid.uuid4())], "name": [name], "opened": 1, "enter": now - 1,
           "exit": now}
    return ("notice", now, msg)


@pytest.mark.cluster  # (an export process)
def test_a_busy_loop_holds_the_writes_for_the_longest_stretch(tmp_path):
    sender = start_sender(tmp_path, always_busy(0.5))
    try:
        sender.send([notice("held")])
        wait_for(lambda: sender.frames >= 1, timeout=10)
        assert sender.hold.held_seconds >= 0.5
        assert sender.hold.stretches == 1
    finally:
        sender.stop(10)


@pytest.mark.cluster  # (an export process)
def test_a_flush_does_not_wait_for_a_busy_loop(tmp_path):
    sender = start_sender(tmp_path, always_busy(3600))
    try:
        sender.send([notice("flushed")])
        started = time.monotonic()
        assert sender.flush(30) is True
        assert time.monotonic() - started < 30
        assert sender.frames == 1
    finally:
        sender.stop(10)


@pytest.mark.cluster  # (an export process)
def test_a_stop_does_not_wait_for_a_busy_loop(tmp_path):
    sender = start_sender(tmp_path, always_busy(3600))
    sender.send([notice("stopped")])
    sender.stop(10)  # (the spans still open are emitted as it ends)
    assert [sp["name"] for sp in read_spans(str(tmp_path / "traces.jsonl"))] == [
        "stopped"]

"""The benchmark's ``--time-limit``: part 1 starts no round that would end past it, and
reports the rounds it ran."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
from bench_scheduler import rounds_within  # noqa: E402


class FakeClock:
    """A clock that a round moves forward by the round's length."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def run_rounds(clock: FakeClock, pairs: int, deadline: float | None,
               lengths: list[float]) -> list[int]:
    ran = []
    for i in rounds_within(pairs, deadline, clock):
        ran.append(i)
        clock.now += lengths[i]
    return ran


def test_without_a_deadline_every_round_runs(clock):
    assert run_rounds(clock, 4, None, [100.0] * 4) == [0, 1, 2, 3]


def test_no_round_starts_that_would_end_past_the_deadline(clock, capsys):
    # 100 s rounds against 350 s: the fourth would end at 400 s
    assert run_rounds(clock, 5, 350.0, [100.0] * 5) == [0, 1, 2]
    assert "stopping after 3 of 5 rounds" in capsys.readouterr().out


def test_the_longest_round_so_far_is_the_estimate(clock):
    # a long second round (200 s) keeps the third from starting at 250 s: 250 + 200
    # passes 400, though the first round alone (50 s) would have let it in
    assert run_rounds(clock, 3, 400.0, [50.0, 200.0, 50.0]) == [0, 1]


def test_the_first_round_runs_whatever_the_deadline(clock):
    assert run_rounds(clock, 3, 10.0, [100.0] * 3) == [0]

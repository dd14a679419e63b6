"""A close notice's times are checked where they enter: times a block could not have
had when the scheduler got its notice are replaced by the notice's arrival."""
from __future__ import annotations

import pytest

from dask_otel_spans.protocol.notices import (
    MAX_BLOCK_SECONDS,
    MAX_CLOCK_SKEW,
    possible_times,
    read_notice,
)

RECEIVED = 1_800_000_000.0


def notice(enter: float, exit_: float) -> dict[str, object]:
    return {"ids": ["s"], "name": ["s"], "opened": 1, "enter": enter, "exit": exit_}


@pytest.mark.parametrize("enter, exit_", [
    (RECEIVED - 3, RECEIVED - 1),
    (RECEIVED - 3, RECEIVED + MAX_CLOCK_SKEW),  # (a client's clock a little ahead)
    (RECEIVED - MAX_BLOCK_SECONDS, RECEIVED),
    (RECEIVED, RECEIVED),
])
def test_times_a_block_could_have_are_kept(enter, exit_):
    fields = read_notice(notice(enter, exit_), RECEIVED)  # type: ignore[arg-type]
    assert (fields.enter, fields.exit, fields.times_ignored) == (enter, exit_, False)


@pytest.mark.parametrize("enter, exit_", [
    (RECEIVED - 1, 1e15),
    (-5, RECEIVED - 1),
    (-5, -5),
    (float("nan"), RECEIVED),
    (RECEIVED - 1, float("nan")),
    (float("-inf"), RECEIVED),
    (RECEIVED - 1, float("inf")),
    (RECEIVED - 1, RECEIVED - 2),  # (out of order)
    (RECEIVED - 1, RECEIVED + MAX_CLOCK_SKEW + 1),
    (RECEIVED - MAX_BLOCK_SECONDS - 1, RECEIVED),
    (RECEIVED * 1000, RECEIVED * 1000),  # (milliseconds)
])
def test_times_a_block_cannot_have_are_replaced_by_the_arrival(enter, exit_):
    assert not possible_times(enter, exit_, RECEIVED)
    fields = read_notice(notice(enter, exit_), RECEIVED)  # type: ignore[arg-type]
    assert (fields.enter, fields.exit, fields.times_ignored) == (RECEIVED, RECEIVED, True)


def test_without_an_arrival_time_the_times_are_read_as_sent():
    fields = read_notice(notice(-5, 1e15))  # type: ignore[arg-type]
    assert (fields.enter, fields.exit, fields.times_ignored) == (-5, 1e15, False)

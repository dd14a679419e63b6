"""Facts about dask that both sides rely on, checked against dask's own objects."""
from __future__ import annotations

import pytest
from distributed.scheduler import ALL_TASK_STATES, TaskGroup, TaskPrefix

from dask_otel_spans.protocol.dask_facts import (
    RUNNING_STATES,
    WAITING_STATES,
    group_done,
    state_counts,
)


def task_group() -> TaskGroup:
    """A scheduler's TaskGroup, as each distributed makes it (its prefix an argument
    in later releases; set after it is made in 2024.1.0)."""
    try:
        return TaskGroup("g", TaskPrefix("g"))
    except TypeError:
        tg = TaskGroup("g")  # type: ignore[call-arg]
        tg.prefix = TaskPrefix("g")
        return tg


@pytest.mark.parametrize("state", sorted(ALL_TASK_STATES))
def test_the_group_verdict_is_taskgroup_done(state):
    for others in (0, 3):
        tg = task_group()
        tg.states["memory"] = others
        tg.states[state] += 1
        assert group_done(tg) is tg.done


def test_a_task_not_settled_is_running_or_waiting():
    assert {"processing", *WAITING_STATES} == set(RUNNING_STATES)


def test_the_counts_by_state_cover_every_task_of_the_group():
    tg = task_group()
    for i, state in enumerate(sorted(ALL_TASK_STATES), 1):
        tg.states[state] += i
    total, erred, running, waiting = state_counts(tg)
    assert total == sum(tg.states.values())
    assert (erred, running) == (tg.states["erred"], tg.states["processing"])
    assert waiting == sum(tg.states[s] for s in WAITING_STATES)


def test_the_installed_distributed_has_every_private_name_the_package_uses():
    """A distributed release that renames one fails here, naming it."""
    from dask_otel_spans.protocol.dask_private import missing_private_names

    missing = missing_private_names()
    assert not missing, (
        f"the installed distributed lacks {', '.join(missing)}, which dask_otel_spans "
        "reads (dask_otel_spans/protocol/dask_private.py)")

"""Facts about dask that both sides rely on, checked against dask's own objects."""
from __future__ import annotations

import pytest
from distributed.scheduler import ALL_TASK_STATES, TaskGroup, TaskPrefix

from dask_otel_spans.protocol.dask_facts import group_done


@pytest.mark.parametrize("state", sorted(ALL_TASK_STATES))
def test_the_group_verdict_is_taskgroup_done(state):
    for others in (0, 3):
        tg = TaskGroup("g", TaskPrefix("g"))
        tg.states["memory"] = others
        tg.states[state] += 1
        assert group_done(tg) is tg.done

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


def test_the_installed_distributed_has_every_private_name_the_package_uses():
    """A distributed release that renames one fails here, naming it."""
    from dask_otel_spans.protocol.dask_private import missing_private_names

    missing = missing_private_names()
    assert not missing, (
        f"the installed distributed lacks {', '.join(missing)}, which dask_otel_spans "
        "reads (dask_otel_spans/protocol/dask_private.py)")

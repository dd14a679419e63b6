"""Facts about dask that both sides rely on: which task states are settled, when a
task group is done, how many of its tasks are in which state, how long late
heartbeats can take."""
from __future__ import annotations

from typing import TYPE_CHECKING

from distributed.scheduler import ALL_TASK_STATES, heartbeat_interval

if TYPE_CHECKING:
    from distributed.scheduler import TaskGroup, TaskStateState
    from distributed.spans import Span

#: Task states a transition can leave a TaskGroup done in (``TaskGroup.done``)
SETTLED_STATES = frozenset({"memory", "erred", "released", "forgotten"})


#: The others: a TaskGroup with a task in one of them is not done
RUNNING_STATES = tuple(sorted(ALL_TASK_STATES - SETTLED_STATES))

#: Of those, the states of a task that waits to run (the other one is ``processing``)
WAITING_STATES = ("waiting", "queued", "no-worker")


def group_done(tg: TaskGroup,
               running_states: tuple[TaskStateState, ...] = RUNNING_STATES) -> bool:
    """``TaskGroup.done`` (no task in a running state) from its state counts,
    without its generator over every state."""
    states = tg.states
    for state in running_states:
        if states.get(state):
            return False
    return True


def state_counts(tg: TaskGroup) -> tuple[int, int, int, int]:
    """A task group's tasks ``(total, erred, running, waiting)`` from its state counts
    (``TaskGroup.states``, which dask keeps): O(1), a few dict reads. ``running`` is
    ``processing``, ``waiting`` the :data:`WAITING_STATES`; the others are settled
    (finished, released or forgotten tasks, and the erred ones)."""
    states = tg.states
    get = states.get
    return (sum(states.values()), get("erred", 0), get("processing", 0),
            get("waiting", 0) + get("queued", 0) + get("no-worker", 0))


def a_running_group(span: Span) -> TaskGroup | None:
    """The span's first task group, if it is not done; else None (no groups, or a
    done first group: the span needs a look). O(1) in the span's groups."""
    for tg in span.groups:
        return None if group_done(tg) else tg
    return None


def grace_period(export_delay: float, n_workers: int) -> float:
    """How long a done span waits for late worker heartbeats: ``export-delay``, and
    at least two heartbeat intervals of a cluster of ``n_workers``."""
    return max(export_delay, 2 * heartbeat_interval(n_workers))

"""Stand-ins for the scheduler's objects the plugin reads, for tests without a cluster
(the spans themselves are real ``distributed.spans.Span`` objects); and a recorder of
the protocol's handlers."""
from __future__ import annotations

from dataclasses import dataclass, field

#: the states ``distributed.scheduler.TaskGroup.done`` counts as finished
_FINISHED = frozenset({"memory", "erred", "released", "forgotten"})


@dataclass(eq=False)
class Prefix:
    """Stands in for a ``TaskPrefix``: its name."""

    name: str


@dataclass(eq=False)
class TaskGroup:
    """Stands in for a ``distributed.scheduler.TaskGroup``: the fields the plugin
    reads (the forwarder, the snapshots, the translation, dask's ``Span``
    properties). ``eq=False``: a span holds its groups in a set, by identity."""

    prefix: Prefix
    start: float = 0.0
    stop: float = 0.0
    nbytes_total: int = 0
    duration: float = 0.0
    states: dict[str, int] = field(default_factory=lambda: {"memory": 0, "erred": 0})
    name: str = ""
    span_id: str | None = None

    @property
    def done(self) -> bool:
        """As ``TaskGroup.done``: no task in a state that is not finished."""
        return all(count == 0 or state in _FINISHED
                   for state, count in self.states.items())


@dataclass(eq=False)
class Task:
    """Stands in for a ``TaskState``: its group (and its run spec, its
    annotations)."""

    group: TaskGroup
    run_spec: object = None
    annotations: dict[str, object] | None = None


class Recorder:
    """Every handler of the protocol (``on_*``), recording its calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple]] = []

    def __getattr__(self, name: str):
        return lambda *args: self.calls.append((name, args))

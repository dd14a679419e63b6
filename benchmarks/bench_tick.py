"""What the forwarder's tick costs the scheduler's event loop per task group, in
isolation.

    python benchmarks/bench_tick.py                  # 200 groups, best of 7 x 200 ticks
    python benchmarks/bench_tick.py --groups 2000 --ticks 50
    python benchmarks/bench_tick.py --bytecodes      # Python bytecodes per group instead
    PYTHONPATH=/tmp/before python benchmarks/bench_tick.py   # an older tree, A/B

The tick (``SpanForwarder.tick``) forwards what the hooks noted since the last one;
per task group it handles, it tells the export side when the group runs or is done,
and (since the live task counts) the group's tasks by state when they changed. Two
cases, each with ``--groups`` real ``distributed.scheduler.TaskGroup`` objects of a
span, all running (a task of each processing, others waiting):

* ``handled``: a task of every group settled since the last tick (the transition hook
  noted the group), so each tick handles every group: the cost per group handled
  per tick, apart from the hook's own (``bench_hooks.py``);
* ``sweep``: nothing settled, every running group's counts are read again (the sweep,
  every ``live.interval``, 1 s at most); half the groups had a task start since the
  last read (their counts changed and are sent), half did not: the cost per running
  group per sweep. A tree without the sweep has nothing to do here (its tick is idle).

The messages go to a sink that drops them (the transport's queueing is not counted).
"""
from __future__ import annotations

import argparse
import inspect
import sys
import timeit
from typing import Any

from bench_hooks import bytecodes
from distributed.scheduler import TaskGroup, TaskPrefix

from dask_otel_spans.scheduler.forwarder import SpanForwarder


class _Sink:
    def send(self, messages: list[Any]) -> None:
        pass


class _Task:
    run_spec = None

    def __init__(self, group: Any):
        self.group = group


class _Clock:
    """A clock each call of which is a second later (every tick finds a sweep due)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def running_groups(n: int) -> list[Any]:
    """``n`` task groups of the span ``s``, each with 10 tasks: 1 processing, 2
    queued, 7 waiting."""
    groups = []
    for i in range(n):
        tg = TaskGroup(f"g{i}", TaskPrefix(f"g{i}"))
        tg.span_id = "s"
        tg.states.update(processing=1, queued=2, waiting=7)
        groups.append(tg)
    return groups


def forwarder_of(groups: list[Any], clock: Any) -> SpanForwarder:
    """A forwarder whose task dict holds a task of each group."""
    tasks = {tg.name: _Task(tg) for tg in groups}
    kwargs: dict[str, Any] = {"clock": clock}
    if "live_interval" in inspect.signature(SpanForwarder).parameters:
        kwargs["live_interval"] = 1.0
    return SpanForwarder({}, tasks, _Sink(), **kwargs)


def handled_tick(forwarder: SpanForwarder, groups: list[Any]) -> Any:
    """One tick in which a task of every group settled (and another one started)."""
    moved = forwarder.task_moved

    def tick() -> None:
        for tg in groups:
            tg.states["memory"] += 1  # (its counts change: they are sent)
            moved(tg.name, "processing", "memory", {})
        forwarder.tick(2)

    def hooks_only() -> None:
        for tg in groups:
            tg.states["memory"] += 1
            moved(tg.name, "processing", "memory", {})
        forwarder.changes.touched.clear()

    return tick, hooks_only


def _start_or_queue(groups: list[Any]) -> None:
    """A queued task of each group starts, or (every other round) goes back."""
    for tg in groups:
        states = tg.states
        if states["queued"] == 2:
            states.update(processing=2, queued=1)
        else:
            states.update(processing=1, queued=2)


def sweep_tick(forwarder: SpanForwarder, groups: list[Any]) -> Any:
    """One tick with nothing settled: a sweep, half the groups' counts changed."""
    half = groups[::2]
    for tg in groups:  # (a task of each started: the groups are forwarded running)
        forwarder.task_moved(tg.name, "released", "waiting", {})
    forwarder.tick(2)

    def tick() -> None:
        _start_or_queue(half)
        forwarder.tick(2)

    return tick, lambda: _start_or_queue(half)


def per_group(tick: Any, baseline: Any, n: int, ticks: int, repeat: int) -> float:
    """Seconds per group per tick: the tick, less what the test itself does."""
    with_tick = min(timeit.repeat(tick, number=ticks, repeat=repeat))
    without = min(timeit.repeat(baseline, number=ticks, repeat=repeat))
    return max(0.0, with_tick - without) / ticks / n


def measure(n: int, ticks: int, repeat: int, count_bytecodes: bool) -> None:
    import dask_otel_spans

    print(f"dask_otel_spans from {dask_otel_spans.__file__}")
    # (handled: a clock that stands still, so no sweep comes after the first)
    for name, make, clock in (("handled", handled_tick, lambda: 0.0),
                              ("sweep", sweep_tick, _Clock())):
        groups = running_groups(n)
        forwarder = forwarder_of(groups, clock)
        tick, baseline = make(forwarder, groups)
        for _ in range(3):  # (the run messages, the first counts: the steady state)
            tick()
        if count_bytecodes:
            per = (bytecodes(tick) - bytecodes(baseline)) / n
            print(f"   {name}: {per:.1f} Python bytecodes per group per tick "
                  f"({n} groups)")
        else:
            seconds = per_group(tick, baseline, n, ticks, repeat)
            print(f"   {name}: {seconds * 1e6:.3f} µs per group per tick "
                  f"({n} groups, best of {repeat} x {ticks} ticks)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=200)
    parser.add_argument("--ticks", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--bytecodes", action="store_true",
                        help="count the Python bytecodes of one tick instead of timing")
    args = parser.parse_args(argv)
    measure(args.groups, args.ticks, args.repeat, args.bytecodes)
    return 0


if __name__ == "__main__":
    sys.exit(main())

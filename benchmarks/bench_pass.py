"""The plugin's event-loop work per span, by phase, on a replay of the nested workload
with no cluster: quick, steady figures to compare two versions of the code.

    python benchmarks/bench_pass.py                        # 7 replays of 2,110 spans
    python benchmarks/bench_pass.py --against /tmp/before  # and a git worktree's plugin,
                                                           # alternating, 5 rounds

The benchmark's nested workload (``bench_scheduler.py``: 10 x 10 x 20 leaf spans of one
task each, every ``span()`` block closed before one graph computes them all) as the
plugin sees it, fed straight to its hooks and passes: the close notices, the graph (real
``distributed.spans.Span`` objects, task groups that stand in for distributed's with
the fields the plugin reads), the tasks settling in ten batches, and the passes until
every span is handed over. A clock that the replay moves stands in for the wall clock;
the emitter and the metrics pump are sinks. It times, with the thread's CPU clock, only
the calls into the plugin, and reports them per span handed over, by phase:

- ``notices``: the ``log_event`` hook and the pass that takes the close notices in;
- ``graph``: the ``update_graph`` hook and the pass that registers the new spans;
- ``settle``: the ``transition`` hook and the passes while the tasks settle;
- ``emit``: the passes after the grace period, which check and emit the spans.

What it leaves out: the sender thread (encoding for the export process), and the cost
of the live scheduler's memory traffic, which makes every figure about 2.5 times this
on the 2-core machine (see the README). Read its figures as ratios between trees, not
as the plugin's cost on a cluster.
"""
from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from bench_trees import add_tree_arguments, run_in_tree, runs_by_tree, scale_of

PHASES = ("notices", "graph", "settle", "emit")
HERE = Path(__file__).resolve().parent


class _Prefix:
    def __init__(self, name: str):
        self.name = name


class _TaskGroup:
    """The fields of ``distributed.scheduler.TaskGroup`` the plugin reads."""

    def __init__(self, name: str, span_id: str, all_states: Any):
        self.name = name
        self.prefix = _Prefix(name.split("-")[0])
        self.span_id = span_id
        self.states = dict.fromkeys(all_states, 0)
        self.states["processing"] = 1
        self.start = self.stop = self.duration = 0.0
        self.nbytes_total = 28


class _Task:
    __slots__ = ("group",)

    def __init__(self, group: _TaskGroup):
        self.group = group


class _Scheduler:
    def __init__(self) -> None:
        self.workers = {"tcp://a": None, "tcp://b": None}
        self.tasks: dict[Any, _Task] = {}


class _Extension:
    def __init__(self) -> None:
        self.spans: dict[str, Any] = {}


class _Sink:
    """Emitter and metrics pump that keep nothing."""

    def emit_many(self, requests: list) -> None:
        pass

    def submit_many(self, calls: list) -> None:
        pass

    def submit(self, *args: Any) -> None:
        pass


def close_notices(a: int, b: int, c: int, now: float) -> tuple[list, list]:
    """The close notices of ``a`` x ``b`` x ``c`` nested blocks in the order the blocks
    exit, as ``dask_otel_spans.span`` sends them; and the leaves' (ids, tags, carried)."""
    def notice(ids: list, tags: list, carried: dict) -> dict:
        return {"ids": ids, "name": tags, "opened": 1, "otel": carried, "enter": now,
                "exit": now, "lazy": True, "client": "Client-bench"}

    # (no OTel span current on the client: each level carries an empty carrier, the
    # nested ones because their parent block's own span is current there)
    notices, leaves = [], []
    for i in range(a):
        id1 = str(uuid.uuid4())
        carried1: dict[str, Any] = {id1: {}}
        for j in range(b):
            id2 = str(uuid.uuid4())
            carried2 = {**carried1, id2: {}}
            for k in range(c):
                id3 = str(uuid.uuid4())
                carried3 = {**carried2, id3: {}}
                ids, tags = [id1, id2, id3], [f"l1-{i}", f"l2-{j}", f"l3-{k}"]
                notices.append(notice(ids, tags, carried3))
                leaves.append((ids, tags, carried3))
            notices.append(notice([id1, id2], [f"l1-{i}", f"l2-{j}"], carried2))
        notices.append(notice([id1], [f"l1-{i}"], carried1))
    return notices, leaves


def replay(a: int, b: int, c: int) -> tuple[dict[str, float], int]:
    """One replay: CPU seconds of the plugin's calls by phase, and spans handed over."""
    import dask_otel_spans.plugin as plugin_module

    clock = [1.7e9]
    wall_clock = plugin_module.time
    plugin_module.time = lambda: clock[0]
    try:
        return _replay(a, b, c, plugin_module, clock)
    finally:
        plugin_module.time = wall_clock


def _replay(a: int, b: int, c: int, plugin_module: Any, clock: list[float]
            ) -> tuple[dict[str, float], int]:
    from distributed.scheduler import ALL_TASK_STATES
    from distributed.spans import Span

    from dask_otel_spans import names

    plugin = plugin_module.OTelSpansPlugin()
    scheduler, ext = _Scheduler(), _Extension()
    plugin.scheduler, plugin._ext, plugin._tasks = scheduler, ext, scheduler.tasks
    plugin._span_tags = plugin_module._SpanTags(ext.spans)
    plugin.emitter = plugin.pump = _Sink()
    notices, leaves = close_notices(a, b, c, clock[0])
    cpu = dict.fromkeys(PHASES, 0.0)
    phase = "notices"

    def timed(call: Any, *args: Any, **kwargs: Any) -> None:
        t0 = time.thread_time()
        call(*args, **kwargs)
        cpu[phase] += time.thread_time() - t0

    def whole_pass() -> None:
        for _ in plugin._one_pass():
            pass
        plugin._deliver()

    def tick() -> None:
        timed(whole_pass)
        clock[0] += plugin.config.tick_interval

    for msg in notices:
        timed(plugin.log_event, names.EVENT_TOPIC, msg)
    tick()

    phase = "graph"
    history = [(0.0, 4)]
    keys, span_of_key, otel_of_key, groups = [], {}, {}, []
    for ids, tags, carried in leaves:  # (distributed makes parents first)
        parent = None
        for level in range(3):
            node = ext.spans.get(ids[level])
            if node is None:
                node = Span(tuple(tags[: level + 1]), ids[level], parent, history)
                ext.spans[ids[level]] = node
                if parent is not None:
                    parent.children.append(node)
            parent = node
        name = f"inc-{uuid.uuid4().hex}"
        group = _TaskGroup(name, ids[-1], ALL_TASK_STATES)
        parent.groups.add(group)
        key = (name, 0)
        scheduler.tasks[key] = _Task(group)
        keys.append(key)
        groups.append((group, key))
        span_of_key[key] = {"name": tuple(tags), "ids": tuple(ids)}
        otel_of_key[key] = carried
    annotations = {"span": span_of_key, names.ANNOTATION_KEY: otel_of_key}
    timed(plugin.update_graph, scheduler, tasks=keys, annotations=annotations,
          client="Client-bench")
    tick()

    phase = "settle"
    per_batch = max(1, len(groups) // 10)
    for start in range(0, len(groups), per_batch):
        for group, key in groups[start : start + per_batch]:
            group.states["processing"] = 0
            group.states["memory"] = 1
            group.start, group.stop, group.duration = clock[0] - 0.01, clock[0], 0.001
            timed(plugin.transition, key, "processing", "memory")
        tick()

    phase = "emit"
    deadline = clock[0] + 10 * (plugin.grace + 1)
    while plugin._open and clock[0] < deadline:
        tick()
    if plugin._open:
        raise RuntimeError(f"{len(plugin._open)} spans were not handed over")
    return cpu, plugin.handed_over_count


def measure(a: int, b: int, c: int, replays: int) -> dict[str, Any]:
    """The best and median replay, in µs per span, total and by phase."""
    totals, by_phase = [], []
    for _ in range(replays):
        gc.collect()
        cpu, spans = replay(a, b, c)
        totals.append(sum(cpu.values()) / spans * 1e6)
        by_phase.append({p: cpu[p] / spans * 1e6 for p in PHASES})
    best = min(range(replays), key=totals.__getitem__)
    return {
        "spans": spans,
        "best": totals[best],
        "median": statistics.median(totals),
        "by_phase_median": {p: statistics.median(r[p] for r in by_phase)
                            for p in PHASES},
    }


def run_tree(tree: str, a: int, b: int, c: int, replays: int) -> dict[str, Any]:
    """:func:`measure` in a fresh interpreter with ``tree`` first on ``sys.path``."""
    return run_in_tree(tree, "import json, sys, bench_pass; print(json.dumps("
                             f"bench_pass.measure({a}, {b}, {c}, {replays})))")


def report(label: str, results: list[dict[str, Any]]) -> None:
    best = min(r["best"] for r in results)
    median = statistics.median(r["median"] for r in results)
    phases = {p: statistics.median(r["by_phase_median"][p] for r in results)
              for p in PHASES}
    print(f"{label}: {best:.2f} µs per span at best, median {median:.2f} "
          f"({results[0]['spans']} spans, {len(results)} round(s)); by phase (medians): "
          + ", ".join(f"{p} {v:.2f}" for p, v in phases.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_tree_arguments(parser, rounds=5)
    parser.add_argument("--replays", type=int, default=7,
                        help="replays per round (each in the same interpreter)")
    args = parser.parse_args(argv)
    a, b, c = scale_of(args)
    results = runs_by_tree(args, str(HERE.parent),
                           lambda tree: run_tree(tree, a, b, c, args.replays))
    trees = list(results)
    for tree in trees:
        report(tree, results[tree])
    if len(trees) == 1:
        return 0
    ratio = statistics.median(
        x["median"] / y["median"] for x, y in zip(results[trees[0]], results[trees[1]]))
    print(f"median per round, this tree / {trees[1]}: {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

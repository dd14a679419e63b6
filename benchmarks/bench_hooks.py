"""What the plugin's ``transition`` hook costs the scheduler per call, in isolation.

    python benchmarks/bench_hooks.py            # 5 x 300,000 calls per transition
    python benchmarks/bench_hooks.py --calls 20000 --repeat 3   # quicker

distributed calls ``transition`` on every scheduler plugin for every transition of every
task, as ``plugin.transition(key, start, finish, stimulus_id=..., **kwargs)`` (the
keyword arguments of ``processing -> memory`` come from the worker's task-finished
message). The plugin does not time this hook (the clock reads would cost more than the
work), so the benchmark's own-CPU figure does not contain it. This measures it: the same
calling loop with the plugin in it and without, best of ``--repeat`` timings, for the
five transitions of a task that runs and is released; and a hook with the same
signature doing nothing, for what being a plugin costs apart from the hook's work.

The hook has two paths: with the export process tracking the spans (the default,
``track-in-export-process``) it adds a started or settled task's group to the span
forwarder's set of touched groups; otherwise (``snapshots``: the scheduler tracks
the spans) it adds a settled task's span id to the plugin's set of settled spans.
Both are measured.
"""
from __future__ import annotations

import argparse
import sys
import timeit
from typing import Any

from dask_otel_spans import OTelSpansPlugin
from dask_otel_spans.forwarding import SpanForwarder
from dask_otel_spans.plugin import _RUNNING_STATES

#: the hook's paths: the span forwarder's (the default) and the snapshots'
PATHS = ("forwarding", "snapshots")

#: keyword arguments of ``processing -> memory`` (``Scheduler.stimulus_task_finished``)
FINISHED_KWARGS = dict(worker="tcp://127.0.0.1:40000", nbytes=28, type=b"int",
                       typename="int", metadata={}, run_id=3, startstops=({},))
#: the transitions of a task that runs and is then released, with their keyword arguments
TRANSITIONS: list[tuple[str, str, dict]] = [
    ("released", "waiting", {}),
    ("waiting", "processing", {}),
    ("processing", "memory", FINISHED_KWARGS),
    ("memory", "released", {}),
    ("released", "forgotten", {}),
]


class _Group:
    span_id = "a-span-id"


class _Task:
    group = _Group()


class NoOpHook:
    """A plugin hook with the plugin's signature and no work."""

    def transition(self, key: Any, start: str, finish: str, *args: Any,
                   **kwargs: Any) -> None:
        pass


def isolated_plugin(path: str = "snapshots") -> OTelSpansPlugin:
    """The plugin's ``transition`` with the state it reads on ``path`` (one of
    :data:`PATHS`), and no scheduler."""
    plugin = OTelSpansPlugin.__new__(OTelSpansPlugin)
    plugin._tasks = {"key": _Task()}
    plugin._settled = set()
    plugin._forwarder = None
    if path == "forwarding":
        plugin._forwarder = SpanForwarder({}, plugin._tasks, None, _RUNNING_STATES)
    elif path != "snapshots":
        raise ValueError(f"unknown path {path!r}: one of {PATHS}")
    return plugin


def cost_per_call(hook: Any, start: str, finish: str, kwargs: dict, calls: int,
                  repeat: int) -> float:
    """Seconds per call that ``hook`` adds to distributed's calling loop (best of
    ``repeat``, with and without it)."""

    def timed(plugins: dict[str, Any]) -> float:
        def loop() -> None:
            for plugin in list(plugins.values()):
                plugin.transition("key", start, finish, stimulus_id="s", **kwargs)
        return min(timeit.repeat(loop, number=calls, repeat=repeat)) / calls

    return timed({"p": hook}) - timed({})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    hooks: dict[str, Any] = {
        f"OTelSpansPlugin.transition, {path}{' (the default)' if i == 0 else ''}":
        isolated_plugin(path) for i, path in enumerate(PATHS)
    }
    hooks["a no-op hook"] = NoOpHook()
    for name, hook in hooks.items():
        total = 0.0
        print(f"{name}, per call (best of {args.repeat} x {args.calls}):")
        for start, finish, kwargs in TRANSITIONS:
            seconds = cost_per_call(hook, start, finish, kwargs, args.calls, args.repeat)
            total += seconds
            print(f"   {start} -> {finish} ({len(kwargs)} keyword arguments): "
                  f"{seconds * 1e6:.3f} µs")
        print(f"   per task (these {len(TRANSITIONS)} transitions): {total * 1e6:.2f} µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())

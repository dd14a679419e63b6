"""What the plugin's ``transition`` hook costs the scheduler per call, in isolation.

    python benchmarks/bench_hooks.py            # 5 x 300,000 calls per transition
    python benchmarks/bench_hooks.py --calls 20000 --repeat 3   # quicker
    python benchmarks/bench_hooks.py --task-spans none,erred,slowest,all
    python benchmarks/bench_hooks.py --bytecodes   # Python bytecodes per call instead

distributed calls ``transition`` on every scheduler plugin for every transition of every
task, as ``plugin.transition(key, start, finish, stimulus_id=..., **kwargs)`` (the
keyword arguments of ``processing -> memory`` come from the worker's task-finished
message). The plugin does not time this hook (the clock reads would cost more than the
work), so the benchmark's own-CPU figure does not contain it. This measures it: the same
calling loop with the plugin in it and without, best of ``--repeat`` timings, for the
five transitions of a task that runs and is released; and a hook with the same
signature doing nothing, for what being a plugin costs apart from the hook's work.

The hook tells the span forwarder of a task that started or settled, which notes its
group for the next tick, and hands tasks to the task sampler as ``task-spans`` asks: erred ones
(none here: the graph has no errors) and, under ``slowest`` and ``all``, finished ones
(``slowest`` compares the compute time with the slowest kept; the task's group keeps
``max-task-spans`` of them, so after the first ten calls this is the steady state).
The plugin is a real one, started on an in-process scheduler (with
an exporter that discards), whose task dict holds the one task the calls name.
"""
from __future__ import annotations

import argparse
import asyncio
import functools
import sys
import timeit
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from distributed import Scheduler
from opentelemetry.sdk.trace import TracerProvider

from dask_otel_spans import OTelSpansPlugin

#: keyword arguments of ``processing -> memory`` (``Scheduler.stimulus_task_finished``)
FINISHED_KWARGS = dict(worker="tcp://127.0.0.1:40000", nbytes=28, type=b"int",
                       typename="int", metadata={}, run_id=3,
                       startstops=[{"action": "compute", "start": 1.0, "stop": 1.5}])
#: the transitions of a task that runs and is then released, with their keyword arguments
TRANSITIONS: list[tuple[str, str, dict]] = [
    ("released", "waiting", {}),
    ("waiting", "processing", {}),
    ("processing", "memory", FINISHED_KWARGS),
    ("memory", "released", {}),
    ("released", "forgotten", {}),
]


def _erred_kwargs() -> dict:
    """Keyword arguments of ``processing -> erred`` as a worker's task-erred message
    gives them (``Scheduler.stimulus_task_erred``): the exception's pickle framed as
    distributed frames it, its ``repr`` and traceback."""
    from distributed.protocol import pickle
    from distributed.protocol.serialize import Serialize, Serialized, serialize

    error = ValueError("record 3: negative amount")
    return dict(
        worker="tcp://127.0.0.1:40000", run_id=3,
        exception=Serialized(*serialize(Serialize(pickle.dumps(error)))),
        traceback=None, exception_text=repr(error),
        traceback_text='  File "task.py", line 1, in f\n', thread=1,
        startstops=[{"action": "compute", "start": 1.0, "stop": 1.5}],
    )


class _Group:
    """A settled task group of a span that is not in the scheduler's span tree (the
    forwarder's tick then sends it nowhere)."""

    span_id = None
    states = {"memory": 1}


class _Task:
    group = _Group()
    run_spec = None


class NoOpHook:
    """A plugin hook with the plugin's signature and no work."""

    def transition(self, key: Any, start: str, finish: str, *args: Any,
                   **kwargs: Any) -> None:
        pass


@asynccontextmanager
async def started_plugin(task_spans: str = "erred") -> AsyncIterator[OTelSpansPlugin]:
    """The plugin, started on an in-process scheduler whose task dict holds the task
    ``"key"`` (of a group in a span)."""
    async with Scheduler(dashboard_address=":0", port=0) as scheduler:
        plugin = OTelSpansPlugin(tracer_provider=TracerProvider(),
                                 task_spans=task_spans)
        await scheduler.register_scheduler_plugin(plugin=plugin, idempotent=False)
        scheduler.tasks["key"] = _Task()
        try:
            yield plugin
        finally:
            del scheduler.tasks["key"]


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


def bytecodes(call: Any) -> int:
    """The Python bytecode instructions one call of ``call`` executes: a count that
    does not move with the machine's load, of the Python it runs (built-ins such as
    ``set.add`` count as the one instruction that calls them)."""
    count = 0

    def local(frame: Any, event: str, arg: Any) -> Any:
        nonlocal count
        if event == "opcode":
            count += 1
        return local

    def traced(frame: Any, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        return local

    sys.settrace(traced)
    try:
        call()
    finally:
        sys.settrace(None)
    return count


def bytecodes_per_call(hook: Any, start: str, finish: str, kwargs: dict) -> int:
    """:func:`bytecodes` of one call of ``hook``'s transition, in the steady state
    (the second call)."""
    # (a partial: no frame of its own, so only the hook's are counted)
    transition = functools.partial(hook.transition, "key", start, finish,
                                   stimulus_id="s", **kwargs)
    transition()
    return bytecodes(transition)


def report_bytecodes(name: str, hook: Any) -> None:
    print(f"{name}, Python bytecodes per call:")
    total = 0
    for start, finish, kwargs in [*TRANSITIONS, ("processing", "erred", _erred_kwargs())]:
        n = bytecodes_per_call(hook, start, finish, kwargs)
        if finish != "erred":
            total += n
        print(f"   {start} -> {finish}: {n}")
    print(f"   per task ({len(TRANSITIONS)} transitions, not erred): {total}")


def report(name: str, hook: Any, calls: int, repeat: int) -> None:
    total = 0.0
    print(f"{name}, per call (best of {repeat} x {calls}):")
    for start, finish, kwargs in TRANSITIONS:
        seconds = cost_per_call(hook, start, finish, kwargs, calls, repeat)
        total += seconds
        print(f"   {start} -> {finish} ({len(kwargs)} keyword arguments): "
              f"{seconds * 1e6:.3f} µs")
    print(f"   per task (these {len(TRANSITIONS)} transitions): {total * 1e6:.2f} µs")
    seconds = cost_per_call(hook, "processing", "erred", _erred_kwargs(), calls, repeat)
    print(f"   processing -> erred (a task that raised; its record kept up to the cap, "
          f"its exception class counted): {seconds * 1e6:.3f} µs")


async def measure(calls: int, repeat: int, modes: list[str], bytecodes: bool) -> None:
    for mode in modes:
        async with started_plugin(mode) as plugin:
            name = f"OTelSpansPlugin.transition, task-spans: {mode}"
            if bytecodes:
                report_bytecodes(name, plugin)
            else:
                report(name, plugin, calls, repeat)
    if not bytecodes:
        report("a no-op hook", NoOpHook(), calls, repeat)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--task-spans", default="erred",
                        help="task-spans settings to measure, comma-separated")
    parser.add_argument("--bytecodes", action="store_true",
                        help="count the Python bytecodes of one call instead of timing")
    args = parser.parse_args(argv)
    asyncio.run(measure(args.calls, args.repeat, args.task_spans.split(","),
                        args.bytecodes))
    return 0


if __name__ == "__main__":
    sys.exit(main())

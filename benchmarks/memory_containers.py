"""Which containers of the export session grow with the spans it has seen: ``small``
(plain ``distributed.span`` blocks of 2 tasks, a task group each) on a local cluster,
the plugin's session in this process (``export_process=False``, the benchmark's
providers that discard), and after each chunk of blocks, once every span was handed
over, the length of every dict, set, list and deque reachable from the session (down
to ``--depth`` attributes; those of more than ``--min-length`` items, not entered).

    python benchmarks/memory_containers.py                  # 4 chunks of 1,000 blocks
    python benchmarks/memory_containers.py --chunks 8 --every 2000

Prints the containers that grew between the first chunk and the last, or hold more
than 500 items: what the session keeps per span seen, by where it is kept (the
bounded ones stop at their size). The SDK's own (its metric series) is not reached
from the session: the caps bound it (README, "Caps").
"""
from __future__ import annotations

import argparse
import collections
import gc
import os
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

#: containers whose length is read
_CONTAINERS = (dict, set, list, collections.deque)
#: leaves and shared machinery not walked
_LEAVES = (int, float, str, bytes, bool, type(None))
_SKIPPED_MODULES = ("logging", "threading", "_thread", "queue")


def container_lengths(root: object, depth: int, min_length: int) -> dict[str, int]:
    """``attribute path -> length`` of the containers reachable from ``root`` with
    more than ``min_length`` items (not entered)."""
    out: dict[str, int] = {}
    seen: set[int] = set()
    stack: list[tuple[Any, str, int]] = [(root, "session", 0)]
    while stack:
        obj, path, level = stack.pop()
        if id(obj) in seen or level > depth:
            continue
        seen.add(id(obj))
        if isinstance(obj, _CONTAINERS) and len(obj) > min_length:
            out[path] = len(obj)
            continue
        items: list[tuple[str, Any]] = []
        attributes = getattr(obj, "__dict__", None)
        if isinstance(attributes, dict):
            items += attributes.items()
        for slot in getattr(type(obj), "__slots__", ()):
            if hasattr(obj, slot):
                items.append((slot, getattr(obj, slot)))
        if isinstance(obj, dict):
            items += [(f"[{key!r}]"[:40], value) for key, value in obj.items()]
        for name, value in items:
            if isinstance(value, _LEAVES) or type(value).__module__.startswith(
                    _SKIPPED_MODULES):
                continue
            stack.append((value, f"{path}.{name}", level + 1))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=4)
    parser.add_argument("--every", type=int, default=1000, help="blocks per chunk")
    parser.add_argument("--depth", type=int, default=5)
    parser.add_argument("--min-length", type=int, default=50)
    args = parser.parse_args(argv)

    from bench_preload import NullSpanExporter, batch_providers
    from bench_scheduler import small_workload
    from distributed import Client, LocalCluster

    from dask_otel_spans import OTelSpansPlugin, wait_for_export
    from dask_otel_spans.export.session import ExportSession

    sessions: list[ExportSession] = []
    start = ExportSession.start

    def remembering(self: ExportSession, *a: Any, **k: Any) -> Any:
        sessions.append(self)
        return start(self, *a, **k)

    ExportSession.start = remembering  # type: ignore[method-assign]
    tracer_provider, meter_provider = batch_providers(NullSpanExporter())
    history: list[dict[str, int]] = []
    with LocalCluster(n_workers=2, threads_per_worker=2, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        client.register_plugin(OTelSpansPlugin(
            tracer_provider=tracer_provider, meter_provider=meter_provider,
            export_process=False))
        t0 = time.monotonic()
        for chunk in range(1, args.chunks + 1):
            small_workload(client, args.every, 2)
            wait_for_export(client, timeout=120)
            gc.collect()
            history.append(container_lengths(sessions[0], args.depth, args.min_length))
            print(f"after {chunk * args.every} blocks ({time.monotonic() - t0:.0f} s)",
                  flush=True)
    for path in sorted(set().union(*history)):
        lengths = [h.get(path, 0) for h in history]
        if lengths[-1] > lengths[0] or lengths[-1] > 500:
            print(f"{path}: {lengths}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

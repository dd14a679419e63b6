"""The floor of a redesigned plugin: what forwarding a span's events to another process
costs the scheduler, against what the plugin costs, per one-task span, on a real
cluster in alternating rounds.

    python benchmarks/bench_floor.py                # 3 rounds of 3 nested workloads each
    python benchmarks/bench_floor.py --rounds 2 --runs 2 --scale 5,10,20

The plugin spent about 30 µs of scheduler CPU per one-task span (runs BB-BC), where a
3 % CPU ratio needs 13-15 (since run BE it tracks the spans in its export process, and
this benchmark compares that plugin with the floor). The README names the design: the
scheduler only forwards what happens, as it happens, and the export process keeps the
readiness state machine (closed, idle, grace, parents waiting for children) and sums
the span metrics from the heartbeat deltas it receives anyway. Before building it, this
benchmark measures what no such design can go below: a scheduler plugin
(:class:`ForwardingPlugin`, preloaded as this module) that does only the scheduler's part
of it, with no state machine, and writes it to a child process that discards it:

- the same hooks as ``OTelSpansPlugin`` (``update_graph``, ``log_event`` and
  ``remove_client`` append a tuple; ``transition`` notes the TaskGroup of a task that
  settles) and the same heartbeat wrappers (the span and worker-wide metric deltas);
- a tick every ``tick-interval`` (0.1 s) that forwards each new dask span (id, parent's
  id, name, when it was queued), each graph (its client, the ids of the spans its tasks
  are in, the distinct W3C chains of its ``otel`` annotation), each close notice and
  client departure as it came (unparsed: the export process would check it), and the
  figures of each TaskGroup whose tasks are all settled (``snapshot_group``, what the
  span snapshot holds of it);
- a sender thread that marshals the batches as the export process's sender does and
  writes them to a pipe.

That this is enough, and not only less: with ``BENCH_FLOOR_RECORD`` set to a file, the
child writes the frames there, and :func:`rebuild_spans` makes of them what an export
process would know of each span (name, parent, when queued, its task groups' figures,
its metrics summed from the deltas); a test checks that this equals what the
scheduler's ``Span`` objects hold (:func:`spans_on_scheduler`), span for span.

What it leaves out, which the redesign would need as well: spans whose snapshot the
export process must ask for (``include-code``, adoption, a restart of the export
process), the nthreads history, the metrics' span names. So its figures are a lower
bound of the redesign's cost, and the plugin's own figures (``bench_preload``, the
plugin with its export process, as ``bench_scheduler.py`` runs it) the current cost.
Both count the same places: the CPU of their ticks and heartbeat wrappers on the event
loop (their four hooks are not timed in either) and of their sender thread, per span
of the nested workload (10 x 10 x 20 one-task leaf spans, as in ``bench_scheduler.py``).
"""
from __future__ import annotations

import argparse
import functools
import marshal
import os
import statistics
import struct
import subprocess
import sys
import time
import weakref
from collections import deque
from collections.abc import Mapping
from itertools import islice
from pathlib import Path
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin
from tornado.ioloop import PeriodicCallback

from dask_otel_spans import names
from dask_otel_spans.background import BackgroundQueue
from dask_otel_spans.plugin import _SETTLED_STATES, _group_done
from dask_otel_spans.snapshot import snapshot_group

HERE = Path(__file__).resolve().parent
VARIANTS = ("plugin", "floor")
FIGURES = ("own", "loop", "sender", "bytes")

_GRAPH, _NOTICE, _CLIENT_GONE = range(3)
#: what the child process runs: read frames and drop them, or (with a file name as
#: its argument) write them to that file
_CHILD = ("import sys\nread = sys.stdin.buffer.raw.read\n"
          "out = open(sys.argv[1], 'wb', buffering=0) if len(sys.argv) > 1 else None\n"
          "while chunk := read(1 << 16):\n"
          "    if out is not None:\n        out.write(chunk)\n")
#: environment variable: a file to record the forwarded frames in (tests)
RECORD_VARIABLE = "BENCH_FLOOR_RECORD"
_HEADER = struct.Struct("<I")
_BATCH_SIZE = 256  # (as the export process's sender)


class Forwarder(BackgroundQueue):
    """The sender thread: batches the items, marshals each batch as one frame and
    writes it to a child process that discards it (or records it in ``record_to``)."""

    def __init__(self, record_to: str | None = None) -> None:
        super().__init__("bench-floor-sender", what="forwarded events")
        self._child = subprocess.Popen(
            [sys.executable, "-c", _CHILD, *([record_to] if record_to else [])],
            stdin=subprocess.PIPE,
        )
        self._batch: list[Any] = []
        self.bytes = 0
        self.frames = 0

    def handle(self, item: Any) -> None:
        self._batch.append(item)
        if len(self._batch) >= _BATCH_SIZE:
            self.settle()

    def next_settle_in(self) -> float | None:
        return 0.0 if self._batch else None

    def settle(self) -> None:
        batch, self._batch = self._batch, []
        if not batch:
            return
        payload = marshal.dumps(batch, 4)
        frame = _HEADER.pack(len(payload) + 1) + b"\x00" + payload
        self._child.stdin.write(frame)
        self._child.stdin.flush()
        self.bytes += len(frame)
        self.frames += 1

    def stop(self, timeout: float = 10) -> None:
        super().stop(timeout)
        self._child.stdin.close()
        self._child.wait(timeout)


class ForwardingPlugin(SchedulerPlugin):
    """The scheduler's part of a plugin whose export process keeps the state: every
    span, graph, close notice, departed client, done TaskGroup and metric delta is
    forwarded as it comes, with no bookkeeping of its own."""

    name = "bench-floor"

    def __init__(self, tick_interval: float = 0.1, record_to: str | None = None):
        self.tick_interval = tick_interval
        self.record_to = record_to
        self.total_call_cpu_seconds = 0.0
        self.forwarded_spans = 0
        self.forwarded_groups = 0
        self.sender: Forwarder | None = None
        self._pending: deque[tuple[Any, ...]] = deque()
        self._settled: set[Any] = set()
        self._n_known = 0
        self._ext: Any = None
        self._tasks: Any = None
        self._pc: PeriodicCallback | None = None

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        self._ext = scheduler.extensions["spans"]
        self._tasks = scheduler.tasks
        self._n_known = len(self._ext.spans)
        self.sender = Forwarder(self.record_to)
        self.sender.start()
        self._wrap_heartbeats()
        self._pc = PeriodicCallback(self._tick, self.tick_interval * 1000)
        self._pc.start()

    async def close(self) -> None:
        if self._pc is not None:
            self._pc.stop()
        if self.sender is not None:
            self.sender.stop()

    # -- the hooks: as OTelSpansPlugin's ------------------------------------------

    def update_graph(self, scheduler: Any, *, tasks: Any = (),
                     annotations: Mapping[str, Any] | None = None,
                     client: str | None = None, **kwargs: Any) -> None:
        otel = span_of_key = None
        if annotations:
            otel = annotations.get(names.ANNOTATION_KEY)
            span_of_key = annotations.get("span")
        self._pending.append((_GRAPH, time.time(), client, tasks, otel, span_of_key))

    def log_event(self, topic: str, msg: Any, **kwargs: Any) -> None:
        if topic == names.EVENT_TOPIC:
            self._pending.append((_NOTICE, time.time(), msg))

    def remove_client(self, scheduler: Any, client: str, **kwargs: Any) -> None:
        self._pending.append((_CLIENT_GONE, time.time(), client))

    def transition(self, key: Any, start: str, finish: str, *args: Any,
                   **kwargs: Any) -> None:
        if finish not in _SETTLED_STATES or start in _SETTLED_STATES:
            return
        ts = self._tasks.get(key)
        if ts is not None and ts.group.span_id is not None:
            self._settled.add(ts.group)

    # -- the heartbeats: as OTelSpansPlugin's, timed -------------------------------

    def _wrap_heartbeats(self) -> None:
        ext, handlers = self._ext, self.scheduler.handlers
        plugin_ref = weakref.ref(self)
        original_span_hb = ext.heartbeat
        original_worker_hb = handlers["heartbeat_worker"]

        @functools.wraps(original_span_hb)
        def span_heartbeat(ws: Any, data: dict) -> None:
            original_span_hb(ws, data)
            plugin = plugin_ref()
            if plugin is not None and data:
                t0 = time.thread_time()
                plugin.sender.put(("deltas", data))
                plugin.total_call_cpu_seconds += time.thread_time() - t0

        @functools.wraps(original_worker_hb)
        def heartbeat_worker(*args: Any, **kwargs: Any) -> Any:
            result = original_worker_hb(*args, **kwargs)
            plugin = plugin_ref()
            metrics = kwargs.get("metrics")
            if plugin is not None and isinstance(metrics, dict):
                t0 = time.thread_time()
                digests = metrics.get("digests_total_since_heartbeat") or {}
                worker_wide = {
                    k: v for k, v in digests.items()
                    if isinstance(k, tuple) and k
                    and k[0] not in names.CONTEXTS_WITH_SPAN_ID
                }
                if worker_wide:
                    plugin.sender.put(("worker-deltas", worker_wide))
                plugin.total_call_cpu_seconds += time.thread_time() - t0
            return result

        ext.heartbeat = span_heartbeat
        handlers["heartbeat_worker"] = heartbeat_worker

    # -- the tick: forward what came since the last one ---------------------------

    def _tick(self) -> None:
        t0 = time.thread_time()
        try:
            out: list[tuple[Any, ...]] = []
            self._forward_new_spans(out)
            self._forward_events(out)
            self._forward_done_groups(out)
            if out:
                self.sender.put(("events", out))
        finally:
            self.total_call_cpu_seconds += time.thread_time() - t0

    def _forward_new_spans(self, out: list[tuple[Any, ...]]) -> None:
        spans = self._ext.spans
        n = len(spans)
        if n <= self._n_known:
            return
        fresh = list(islice(reversed(spans.values()), 0, n - self._n_known))
        self._n_known = n
        for span in reversed(fresh):
            parent = span.parent
            out.append(("span", span.id, parent.id if parent is not None else None,
                        tuple(span.name), span.enqueued))
        self.forwarded_spans += len(fresh)

    def _forward_events(self, out: list[tuple[Any, ...]]) -> None:
        pending = self._pending
        while pending:
            event = pending.popleft()
            kind = event[0]
            if kind == _GRAPH:
                _, now, client, keys, otel, span_of_key = event
                out.append(("graph", now, client, self._span_ids(keys, span_of_key),
                            self._chains(otel)))
            elif kind == _NOTICE:
                out.append(("notice", event[1], event[2]))
            else:
                out.append(("client-gone", event[1], event[2]))

    def _span_ids(self, keys: Any, span_of_key: Any) -> list[str]:
        """The ids of the spans the graph's tasks are in (what ``_mark_activity``
        reads)."""
        if not isinstance(span_of_key, Mapping):
            span_of_key = {}
        tasks = self._tasks
        span_ids = set()
        for key in keys:
            ann = span_of_key.get(key)
            if ann:
                span_ids.add(ann["ids"][-1])
                continue
            ts = tasks.get(key)
            if ts is not None:
                span_ids.add(ts.group.span_id)
        return list(span_ids)

    @staticmethod
    def _chains(otel: Any) -> list[Any]:
        """The distinct chains of an ``otel`` annotation (one value object per chain
        of spans)."""
        if not isinstance(otel, Mapping):
            return []
        seen: dict[int, Any] = {}
        for value in otel.values():
            seen.setdefault(id(value), value)
        return list(seen.values())

    def _forward_done_groups(self, out: list[tuple[Any, ...]]) -> None:
        settled, self._settled = self._settled, set()
        for tg in settled:
            if _group_done(tg):
                out.append(("group", tg.span_id, tg.name, snapshot_group(tg)))
                self.forwarded_groups += 1


def dask_setup(scheduler: Any) -> None:
    scheduler.add_plugin(ForwardingPlugin(record_to=os.environ.get(RECORD_VARIABLE)))


# -- what the forwarded events hold ---------------------------------------------------

def read_recording(path: str) -> list[tuple[Any, ...]]:
    """The items of the frames a recording forwarder wrote to ``path``, in order."""
    with open(path, "rb") as f:
        data = f.read()
    items: list[tuple[Any, ...]] = []
    at = 0
    while at + _HEADER.size <= len(data):
        (size,) = _HEADER.unpack_from(data, at)
        at += _HEADER.size
        if at + size > len(data):
            break  # (a frame still being written)
        items += marshal.loads(data[at + 1 : at + size])
        at += size
    return items


def rebuild_spans(items: list[tuple[Any, ...]]) -> dict[str, dict[str, Any]]:
    """What an export process could know of each span from the forwarded events alone:
    its name, parent, when it was queued, its task groups' figures as last forwarded
    done, and its own metrics summed from the heartbeat deltas (as
    ``SpansSchedulerExtension.heartbeat`` sums them into ``Span``)."""
    spans: dict[str, dict[str, Any]] = {}

    def record(span_id: str) -> dict[str, Any]:
        # (a heartbeat's deltas may come before the tick that forwards their span)
        return spans.setdefault(span_id, {"groups": {}, "metrics": {}})

    for item in items:
        if item[0] == "events":
            for event in item[1]:
                if event[0] == "span":
                    _, span_id, parent, name, enqueued = event
                    record(span_id).update(name=tuple(name), parent=parent,
                                           enqueued=enqueued)
                elif event[0] == "group":
                    _, span_id, group, figures = event
                    record(span_id)["groups"][group] = tuple(figures)
        elif item[0] == "deltas":
            for (context, span_id, *other), value in item[1].items():
                metrics = record(span_id)["metrics"]
                key = (context, *other)
                metrics[key] = metrics.get(key, 0.0) + value
    return spans


def spans_on_scheduler(dask_scheduler: Any = None) -> dict[str, dict[str, Any]]:
    """The same figures, read from the scheduler's ``Span`` objects (run on the
    scheduler)."""
    return {
        span.id: {
            "name": tuple(span.name),
            "parent": span.parent.id if span.parent is not None else None,
            "enqueued": span.enqueued,
            "groups": {tg.name: snapshot_group(tg) for tg in span.groups},
            "metrics": dict(span._cumulative_worker_metrics),
        }
        for span in dask_scheduler.extensions["spans"].spans.values()
    }


# -- what the benchmark reads on the scheduler ---------------------------------------

def floor_figures(dask_scheduler: Any = None) -> dict[str, float]:
    """The forwarding plugin's figures so far (run on the scheduler)."""
    plugin = dask_scheduler.plugins[ForwardingPlugin.name]
    return {
        "spans": plugin.forwarded_spans,
        "groups": plugin.forwarded_groups,
        "loop": plugin.total_call_cpu_seconds,
        "sender": plugin.sender.cpu_seconds,
        "bytes": plugin.sender.bytes,
    }


_PLUGIN_BYTES = {"bytes": 0}


def count_plugin_bytes(dask_scheduler: Any = None) -> bool:
    """Count the bytes of the frames the plugin's sender makes (run on the scheduler;
    one ``len`` per frame, no clock reads: ``bench_sender``'s timers would add to the
    CPU this benchmark compares)."""
    sender = dask_scheduler.plugins[names.PLUGIN_NAME].export_process
    encode = sender._encode

    def encode_and_count(batch: Any) -> bytes:
        frame = encode(batch)
        _PLUGIN_BYTES["bytes"] += len(frame)
        return frame

    sender._encode = encode_and_count
    return True


def plugin_figures(dask_scheduler: Any = None) -> dict[str, float]:
    """The plugin's figures so far, in the same places (run on the scheduler)."""
    plugin = dask_scheduler.plugins[names.PLUGIN_NAME]
    return {
        "spans": plugin.handed_over_count,
        "open": plugin.open_span_count,
        "loop": plugin.total_call_cpu_seconds,
        "sender": plugin.export_process.cpu_seconds,
        "bytes": _PLUGIN_BYTES["bytes"],
    }


#: seconds both variants go on counting after their workload's spans are all in:
#: heartbeats with the workload's last metric deltas
SETTLE_S = 2.0


def measure(variant: str, runs: int, a: int, b: int, c: int) -> list[dict[str, float]]:
    """Per-span figures of ``runs`` nested workloads on one cluster whose scheduler
    runs ``variant``: ``"plugin"`` (with its export process) or ``"floor"``."""
    import bench_scheduler as bench

    if variant not in VARIANTS:
        raise ValueError(f"variant: one of {VARIANTS}, not {variant!r}")
    floor = variant == "floor"
    if floor:
        cluster = bench.Cluster(False, 2, 2, preload="bench_floor")
        figures = floor_figures
    else:
        cluster = bench.Cluster(True, 2, 2, export_process=True)
        figures = plugin_figures
    # the leaf spans, their ancestors and the span of the gather
    expected = a * b * c + a * b + a + 1
    try:
        client = cluster.client
        bench.futures_workload(client, 4, 10)
        if not floor:
            bench.wait_until_plugin_idle(client)
            client.run_on_scheduler(count_plugin_bytes)
        time.sleep(SETTLE_S)
        out = []
        for _ in range(runs):
            start = client.run_on_scheduler(figures)
            bench.nested_workload(client, a, b, c)
            deadline = time.monotonic() + 120
            while True:
                now = client.run_on_scheduler(figures)
                if floor:
                    # every span made, and every TaskGroup's figures forwarded
                    done = (now["spans"] - start["spans"] >= expected
                            and now["groups"] - start["groups"] >= a * b * c + 1)
                else:
                    done = now["spans"] - start["spans"] >= expected and not now["open"]
                if done or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            time.sleep(SETTLE_S)
            end = client.run_on_scheduler(figures)
            d = {k: end[k] - start[k] for k in ("spans", "loop", "sender", "bytes")}
            spans = max(d["spans"], 1)
            run = {
                "spans": d["spans"],
                "own": (d["loop"] + d["sender"]) / spans * 1e6,
                "loop": d["loop"] / spans * 1e6,
                "sender": d["sender"] / spans * 1e6,
                "bytes": d["bytes"] / spans,
            }
            if floor:
                run["groups"] = end["groups"] - start["groups"]
            out.append(run)
        return out
    finally:
        cluster.close()


def report(variant: str, results: list[dict[str, float]]) -> None:
    what = {"plugin": "the plugin (with its export process)",
            "floor": "the floor (forwarding only, bench_floor.ForwardingPlugin)"}
    print(f"{what[variant]}: {len(results)} runs of {results[0]['spans']} spans; per "
          "span, median (min-max):")
    for k in FIGURES:
        values = [r[k] for r in results]
        unit = "bytes" if k == "bytes" else "µs"
        print(f"   {k:<7} {statistics.median(values):8.2f} "
              f"({min(values):.2f}-{max(values):.2f}) {unit}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", default="10,10,20",
                        help="a,b,c: a x b x c leaf spans (default 10,10,20)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds, each variant once per round, alternating order")
    parser.add_argument("--runs", type=int, default=3,
                        help="nested workloads per variant and round, on one cluster")
    args = parser.parse_args(argv)
    a, b, c = (int(x) for x in args.scale.split(","))
    # (the module by name, not __main__: the functions run on the scheduler are
    # then pickled by reference)
    import bench_floor

    results: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    for i in range(args.rounds):
        for variant in VARIANTS if i % 2 == 0 else VARIANTS[::-1]:
            runs = bench_floor.measure(variant, args.runs, a, b, c)
            results[variant] += runs
            print(f"  round {i + 1}/{args.rounds}: {variant} own "
                  + ", ".join(f"{r['own']:.1f}" for r in runs) + " µs per span",
                  flush=True)
    for variant in VARIANTS:
        report(variant, results[variant])
    paired = [f["own"] / p["own"] for f, p in zip(results["floor"], results["plugin"])]
    print(f"own CPU per span, floor / plugin, median of the paired runs: "
          f"{statistics.median(paired):.3f} (min {min(paired):.3f}, max "
          f"{max(paired):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The export process's CPU per span, steady enough to compare two versions of it:
what a real scheduler sent its export process during nested workloads, recorded
once, then replayed at its own pace into the export process's loop, with exporters
that discard, in fresh interpreters.

    python benchmarks/bench_child.py                        # record 3 nested workloads,
                                                            # replay them 5 times
    python benchmarks/bench_child.py --against /tmp/before  # each tree records its own
                                                            # stream; replays alternate

On the live benchmark (``bench_scheduler.py --export-process``) the export process
spends about half as much CPU as the scheduler itself on one-task spans, on the same
cores; its figure there moves by 10-20 % between rounds with what else the machine
runs. Here nothing else runs: a recording (``bench_preload.record_child_frames``: a
real ``dask scheduler`` with the plugin and its export process, 2 workers x 2
threads) keeps every frame the scheduler's sender wrote and when, and each replay
feeds them, at the recorded times, through a pipe to
:func:`dask_otel_spans.export_child.serve` (what ``python -m
dask_otel_spans.export_child`` runs) in a fresh interpreter whose providers discard
what they are given (a batch span processor and a periodic metric reader, as in
``bench_scheduler.py``). It reports, per span exported:

- ``cpu``: the process's CPU from the first frame to the end of the stream, all
  threads, µs;
- the same by thread (``main``: reading and decoding frames, applying them to the
  copy of the span tree; ``tracker``: its passes; ``emitter``: translation and the
  SDK's spans; ``metrics``: the metric instruments; ``stats``: the figures sent to
  the scheduler; ``sdk``: the SDK's own threads; ``other``: the replay's feeder);
- ``gc``: of ``cpu``, the garbage collector's part.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import pickle
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from bench_trees import add_tree_arguments, alternate, run_in_tree, scale_of

HERE = Path(__file__).resolve().parent
#: Threads by name prefix, as the report groups them (the rest: "other")
THREAD_GROUPS = (
    ("MainThread", "main"),
    ("dask-otel-spans-export-tracker", "tracker"),
    ("dask-otel-spans-emitter", "emitter"),
    ("dask-otel-spans-metrics", "metrics"),
    ("dask-otel-spans-export-stats", "stats"),
    ("OtelBatchSpanProcessor", "sdk"),
    ("OtelPeriodicExportingMetricReader", "sdk"),
)
FIGURES = ("cpu", "main", "tracker", "emitter", "metrics", "stats", "sdk", "other",
           "gc")
#: Seconds the replay waits after the last frame, before the stream ends (the
#: spans still in their grace period are emitted meanwhile, as they were live)
TAIL_S = 3.0


# -- recording (a real cluster) -------------------------------------------------------


def record(path: str, runs: int, a: int, b: int, c: int,
           tree: str | None = None) -> int:
    """Record in ``path`` what the scheduler sends its export process over ``runs``
    nested workloads (``a`` x ``b`` x ``c`` one-task leaf spans) on a real cluster
    whose plugin is ``tree``'s; the spans the plugin handed over."""
    import bench_scheduler as bench

    cluster = bench.Cluster(True, 2, 2, export_process=True, plugin_tree=tree,
                            child_frames=path)
    try:
        client = cluster.client
        bench.futures_workload(client, 4, 10)  # as bench_scheduler warms up
        for _ in range(runs):
            bench.nested_workload(client, a, b, c)
        stats = bench.wait_until_plugin_idle(client, timeout=120)
        return int(stats["handed_over"])
    finally:
        cluster.close()


def load_stream(path: str) -> tuple[Any, list[tuple[float, bytes]]]:
    """The spec and frames the last export process of a recording was sent."""
    spec, frames = None, []
    with open(path, "rb") as f:
        while True:
            try:
                record_ = pickle.load(f)
            except EOFError:
                break
            if record_[0] == "spec":  # a (re)start: its stream begins here
                spec, frames = record_[1], []
            else:
                frames.append((record_[1], record_[2]))
    if spec is None:
        raise ValueError(f"{path}: no export process started in the recording")
    return spec, frames


# -- replay (a fresh interpreter) -----------------------------------------------------


def discarding_providers() -> tuple[Any, Any]:
    """The replay's providers: as the live benchmark's, exporting nowhere."""
    from bench_preload import NullSpanExporter, batch_providers

    return batch_providers(NullSpanExporter())


class _Answers:
    """The export process's stdout: each frame it writes, decoded as it comes."""

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.stats: dict[str, Any] = {}

    def write(self, frame: bytes) -> int:
        from dask_otel_spans.wire import decode_payload

        message = decode_payload(bytes(frame)[4:])
        if message[0] in ("ready", "failed"):
            self.ready.set()
        elif message[0] in ("stats", "stopped"):
            self.stats = message[1]
        elif message[0] == "flushed":
            self.stats = message[3]
        return len(frame)

    def flush(self) -> None:
        pass


def _thread_cpu() -> dict[str, float]:
    """CPU seconds of this process's live threads (their CPU-time clocks, to the
    nanosecond), by :data:`THREAD_GROUPS`."""
    out: dict[str, float] = {}
    for thread in threading.enumerate():
        try:
            seconds = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
        except (OSError, TypeError):  # ended meanwhile
            continue
        group = next((g for prefix, g in THREAD_GROUPS
                      if thread.name.startswith(prefix)), "other")
        out[group] = out.get(group, 0.0) + seconds
    return out


def _wait_until_idle(quiet_s: float = 0.2, timeout: float = 30.0) -> None:
    """Return once this process spent under 2 % of a core over ``quiet_s``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = time.process_time()
        time.sleep(quiet_s)
        if time.process_time() - before < 0.02 * quiet_s:
            return


def _feed(pipe: IO[bytes], spec_frame: bytes, frames: Sequence[tuple[float, bytes]],
          answers: _Answers, marks: dict[str, Any]) -> None:
    """Write the spec, wait until the loop is ready, then the frames at their
    recorded times; note the CPU clocks at the first frame and before the end."""
    pipe.write(spec_frame)
    pipe.flush()
    answers.ready.wait(120)
    _wait_until_idle()  # (the loop may import and settle more after "ready")
    marks["cpu0"], marks["threads0"] = time.process_time(), _thread_cpu()
    marks["gc0"] = marks["gc"][0]
    first, start = frames[0][0], time.monotonic()
    for at, frame in frames:
        wait = at - first - (time.monotonic() - start)
        if wait > 0:
            time.sleep(wait)
        pipe.write(frame)
        pipe.flush()
    time.sleep(TAIL_S)
    marks["threads1"] = _thread_cpu()
    pipe.close()


def replay(path: str) -> dict[str, float]:
    """Replay a recording into :func:`~dask_otel_spans.export_child.serve` in this
    process; its figures per span exported (:data:`FIGURES`)."""
    from dask_otel_spans import export_child
    from dask_otel_spans.wire import encode_frame

    spec, frames = load_stream(path)
    spec = dataclasses.replace(
        spec, providers_factory="bench_child:discarding_providers", environ={}
    )
    answers = _Answers()
    marks: dict[str, Any] = {"gc": [0.0]}
    gc_started: dict[int, float] = {}

    def gc_clock(phase: str, info: dict) -> None:
        if phase == "start":
            gc_started[threading.get_ident()] = time.thread_time()
        else:
            started = gc_started.pop(threading.get_ident(), None)
            if started is not None:
                marks["gc"][0] += time.thread_time() - started

    gc.callbacks.append(gc_clock)
    read_end, write_end = os.pipe()
    feeder = threading.Thread(
        target=_feed,
        args=(os.fdopen(write_end, "wb"), encode_frame(spec), frames, answers, marks),
        name="bench-feeder", daemon=True,
    )
    feeder.start()
    with os.fdopen(read_end, "rb") as inbox:
        export_child.serve(inbox, export_child._Outbox(answers))
    cpu = time.process_time() - marks["cpu0"]
    feeder.join()
    spans = max(1, int(answers.stats.get("exported", 0)))
    threads = {g: marks["threads1"].get(g, 0.0) - marks["threads0"].get(g, 0.0)
               for g in marks["threads1"]}
    out = {"spans": spans, "cpu": cpu / spans * 1e6,
           "gc": (marks["gc"][0] - marks["gc0"]) / spans * 1e6}
    for group in FIGURES[1:-1]:
        out[group] = threads.get(group, 0.0) / spans * 1e6
    return out


# -- rounds ---------------------------------------------------------------------------


def record_tree(tree: str, path: str, runs: int, a: int, b: int, c: int) -> int:
    """:func:`record` in a fresh interpreter with ``tree`` first on ``sys.path``."""
    return run_in_tree(tree, "import json, bench_child; print(json.dumps(bench_child"
                             f".record({path!r}, {runs}, {a}, {b}, {c}, {tree!r})))")


def replay_tree(tree: str, path: str) -> dict[str, float]:
    """:func:`replay` in a fresh interpreter with ``tree`` first on ``sys.path``."""
    return run_in_tree(tree, "import json, bench_child; print(json.dumps("
                             f"bench_child.replay({path!r})))")


def report(label: str, results: list[dict[str, float]]) -> None:
    print(f"{label} ({len(results)} replays of {results[0]['spans']} spans), "
          "export process CPU per span exported, median (min-max):")
    for k in FIGURES:
        values = [r[k] for r in results]
        print(f"   {k:<8} {statistics.median(values):8.1f} "
              f"({min(values):.1f}-{max(values):.1f}) µs")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_tree_arguments(parser, rounds=5)
    parser.add_argument("--runs", type=int, default=3,
                        help="nested workloads recorded")
    parser.add_argument("--replays", type=int, default=5,
                        help="replays without --against")
    parser.add_argument("--recording", metavar="FILE",
                        help="replay this recording (of this tree) instead of "
                        "making one")
    args = parser.parse_args(argv)
    a, b, c = scale_of(args)
    here = str(HERE.parent)
    trees = [here]
    if args.against is not None:
        trees.append(str(Path(args.against).resolve()))
    with tempfile.TemporaryDirectory() as tmp:
        recordings = {}
        for i, tree in enumerate(trees):
            if args.recording and tree == here:
                recordings[tree] = args.recording
                continue
            recordings[tree] = os.path.join(tmp, f"frames-{i}.pickle")
            handed = record_tree(tree, recordings[tree], args.runs, a, b, c)
            print(f"recorded {tree}: {args.runs} nested workloads, {handed} spans "
                  "handed over", flush=True)
        rounds = args.replays if args.against is None else args.rounds
        results = alternate(trees, rounds,
                            lambda tree: replay_tree(tree, recordings[tree]))
    for tree in trees:
        report(tree, results[tree])
    if len(trees) == 2:
        ratio = statistics.median(
            x["cpu"] / y["cpu"] for x, y in zip(results[trees[0]], results[trees[1]])
        )
        print(f"export process CPU per span, median of the paired replays, this tree / "
              f"{trees[1]}: {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

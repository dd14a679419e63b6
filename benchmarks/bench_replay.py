"""The export side alone, on a recorded workload: the messages an export session
received from a real scheduler (``--record``), replayed into a fresh session in one
process, with the benchmark's providers (``bench_preload.batch_providers``: a batch
span processor, a periodic metric reader, exporters that discard).

    python benchmarks/bench_replay.py --record /tmp/nested.msgs          # a cluster, once
    python benchmarks/bench_replay.py /tmp/nested.msgs --repeat 5        # CPU per span
    python benchmarks/bench_replay.py /tmp/nested.msgs --against /tmp/before

What the export process does per span, without the cluster, the pipe or the other
processes of the machine in the figure: the CPU of the replaying process (every
thread: session, ender, metrics, the SDK's), from the first message to the last
span handed to the SDK and the providers flushed, per dask span, best of
``--repeat`` (the least disturbed run; each run is a fresh session). The messages are
fed as fast as the session takes them: every span's grace period has passed when
it is looked at, so the readiness passes are fewer than live; the per-span work is
the same. ``--against TREE`` replays with the package of another source tree too, in
alternating runs of the same invocation (an A/B of the export side).
"""
from __future__ import annotations

import argparse
import ast
import os
import pickle
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)


def record(path: str, leaves: int) -> None:
    """Run ``nested`` (``leaves`` one-task leaf spans, three levels) on a local cluster,
    the plugin's session in this process, and keep every batch of messages it was sent."""
    from bench_preload import NullSpanExporter, batch_providers
    from bench_scheduler import nested_workload
    from distributed import Client, LocalCluster

    from dask_otel_spans import OTelSpansPlugin, wait_for_export
    from dask_otel_spans.export.session import ExportSession

    batches: list[list[tuple[Any, ...]]] = []
    send = ExportSession.send

    def recording(self: ExportSession, messages: list[tuple[Any, ...]]) -> None:
        batches.append(list(messages))
        send(self, messages)

    ExportSession.send = recording  # type: ignore[method-assign]
    tracer_provider, meter_provider = batch_providers(NullSpanExporter())
    with LocalCluster(n_workers=2, threads_per_worker=2, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        client.register_plugin(OTelSpansPlugin(
            tracer_provider=tracer_provider, meter_provider=meter_provider,
            export_process=False))
        nested_workload(client, 10, 10, max(1, leaves // 100))
        state = wait_for_export(client, timeout=120)
    with open(path, "wb") as f:
        pickle.dump({"batches": batches, "handed_over": state.handed_over}, f)
    print(f"recorded {sum(map(len, batches))} messages in {len(batches)} batches, "
          f"{state.handed_over} spans handed over, to {path}")


def replay(path: str) -> dict[str, float]:
    """Replay the recording into a fresh session; CPU seconds and spans."""
    from bench_preload import NullSpanExporter, batch_providers

    from dask_otel_spans.config import PluginConfig
    from dask_otel_spans.export.pipeline import ExportPipeline
    from dask_otel_spans.export.session import ExportSession
    from dask_otel_spans.sdk.providers import Providers

    with open(path, "rb") as f:
        recording = pickle.load(f)
    tracer_provider, meter_provider = batch_providers(NullSpanExporter())
    config = PluginConfig.from_dask_config()
    # (owned, as the package's own providers are: the embedded default, OTEL_*)
    pipeline = ExportPipeline.build(Providers(tracer_provider, meter_provider,
                                              owned=[tracer_provider, meter_provider],
                                              built=[tracer_provider, meter_provider]),
                                    config)
    session = ExportSession(pipeline, config)
    session.start()
    try:  # (the export process sets its garbage collector so, once set up)
        from dask_otel_spans.transport.child import settle_garbage_collector
    except ImportError:  # (a tree from before it)
        pass
    else:
        settle_garbage_collector()
    expected = recording["handed_over"]
    cpu0 = time.process_time()
    for batch in recording["batches"]:
        session.send(batch)
    deadline = time.monotonic() + 600
    while session.tracker.handed_over < expected and time.monotonic() < deadline:
        session.flush(60)
    session.flush(60)
    tracer_provider.force_flush()
    meter_provider.force_flush()
    cpu = time.process_time() - cpu0
    handed = session.tracker.handed_over
    session.stop(10)
    return {"cpu_s": cpu, "spans": handed, "expected": expected}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", help="the recording")
    parser.add_argument("--record", action="store_true",
                        help="run nested on a local cluster and write the recording")
    parser.add_argument("--leaves", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--against", metavar="TREE", default=None,
                        help="also replay with the package of this source tree")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.record:
        record(args.path, args.leaves)
        return 0
    if args.one:  # (a child of the A/B: one replay, its figures on stdout)
        print(repr(replay(args.path)))
        return 0
    trees = {"this tree": ROOT}
    if args.against:
        trees["against"] = os.path.abspath(args.against)
    best: dict[str, float] = {}
    spans = 0
    for i in range(args.repeat):
        for name, tree in trees.items():
            env = {**os.environ,
                   "PYTHONPATH": os.pathsep.join([tree, HERE, *sys.path])}
            env = {k: v for k, v in env.items() if not k.startswith("OTEL_")}
            out = subprocess.run(
                [sys.executable, os.path.abspath(__file__), args.path, "--one"],
                env=env, cwd=HERE, capture_output=True, text=True, check=True)
            figures = ast.literal_eval(out.stdout.strip().splitlines()[-1])
            if figures["spans"] != figures["expected"]:
                print(f"  {name}: {figures['spans']} of {figures['expected']} spans")
            spans = figures["spans"]
            per_span = figures["cpu_s"] / max(1, spans) * 1e6
            best[name] = min(best.get(name, float("inf")), per_span)
            print(f"  run {i + 1}, {name}: {per_span:.1f} µs of CPU per dask span",
                  flush=True)
    for name, value in best.items():
        print(f"{name}: {value:.1f} µs of CPU per dask span, best of {args.repeat} "
              f"({spans} spans)")
    if "against" in best:
        print(f"this tree / against: {best['this tree'] / best['against']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

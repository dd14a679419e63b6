"""What profiles (``otel-spans.profile.enabled``) cost, where they are paid.

    python benchmarks/bench_profiles.py            # both parts
    python benchmarks/bench_profiles.py --quick    # smoke run

1. worker: a worker serving one profile request for a 10-minute window of a prefix
   (``Worker.get_profile(start=, stop=, key=)``, distributed's own method, run on
   a history of 600 one-second cycles), its CPU time and the bytes of its answer as
   distributed's protocol encodes it, and the time to decode it (on the scheduler's
   event loop, where the comm reads it, as for ``Client.profile``); what
   ``Scheduler.get_profile`` does next on the event loop (``profile.merge``, per
   answer), and what the export process does with it instead (read and merged,
   ``protocol/profiles.py``). The cycles are
   those a real worker recorded (an in-process ``LocalCluster``, sampling every
   10 ms) while a prefix ran pandas, numpy and pure-Python code, repeated to fill
   the window.
2. scheduler: the event loop's part per message (``ProfileFetcher.tap``, the glance
   at each message's kind the forwarder sends), per ``run``/``done`` message
   and per other message; best of ``--repeat``, CPU time of this thread.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def mixed_work(seed: int) -> float:
    """A task of several kinds of code: pandas, numpy and pure Python."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    df = pd.DataFrame({"k": rng.integers(0, 100, 200_000), "v": rng.random(200_000)})
    total = float(df.groupby("k")["v"].mean().sum())
    total += float(np.linalg.norm(rng.random((300, 300)) @ rng.random((300, 300))))
    total += sum(len(str(i)) for i in range(200_000))
    return total


def recorded_cycles(seconds: float) -> list[tuple[float, dict]]:
    """The cycles a real worker recorded for the prefix ``mixed_work``."""
    import dask
    from distributed import Client, LocalCluster

    with dask.config.set({"distributed.worker.profile.cycle": "1s"}):
        with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                          dashboard_address=None) as cluster, Client(cluster) as client:
            end = time.monotonic() + seconds
            i = 0
            while time.monotonic() < end:
                client.gather(client.map(mixed_work, range(i, i + 4)))
                i += 4
            time.sleep(1.2)  # (the last cycle closes)
            (worker,) = cluster.workers.values()
            return [(t, d["mixed_work"]) for t, d in worker.profile_keys_history
                    if "mixed_work" in d]


def serving(cycles: list[tuple[float, dict]], n: int, repeat: int) -> dict[str, float]:
    """CPU seconds and bytes of one ``Worker.get_profile`` over ``n`` cycles."""
    from collections import deque

    from distributed import profile
    from distributed.protocol import dumps, loads
    from distributed.worker import Worker

    from dask_otel_spans.protocol.profiles import ROOT, Node, merge_into, read_tree

    now = time.time()
    history = deque(((now - n + i, {"mixed_work": cycles[i % len(cycles)][1]})
                     for i in range(n)), maxlen=n)
    fake = SimpleNamespace(profile_keys_history=history, scheduler_delay=0.0,
                           profile_keys={"mixed_work": profile.create()},
                           profile_recent=profile.create(), profile_history=deque())
    times = []
    result = None
    for _ in range(repeat):
        t0 = time.thread_time()
        result = asyncio.run(Worker.get_profile(fake, start=now - n, stop=now,
                                                key="mixed_work"))
        frames = dumps({"status": "OK", "result": result})
        times.append(time.thread_time() - t0)
    assert result is not None
    decode = []
    for _ in range(repeat):
        t0 = time.thread_time()
        loads(frames)
        decode.append(time.thread_time() - t0)
    decoded = loads(frames)["result"]
    merge, read = [], []
    for _ in range(repeat):
        # what Scheduler.get_profile (and the dashboard's profile pages through it)
        # does next on the event loop: profile.merge of the answers, per answer
        t0 = time.thread_time()
        profile.merge(decoded, decoded, decoded, decoded)
        merge.append((time.thread_time() - t0) / 4)
        # what the export process does with it (protocol/profiles.py)
        t0 = time.thread_time()
        merge_into(Node(ROOT), read_tree(decoded))
        read.append(time.thread_time() - t0)
    nodes = 0
    todo = [result]
    while todo:
        node = todo.pop()
        nodes += 1
        todo.extend(node["children"].values())
    return {"cpu_s": min(times), "median_cpu_s": statistics.median(times),
            "bytes": sum(len(f) for f in frames), "samples": result["count"],
            "nodes": nodes, "decode_s": min(decode), "merge_s": min(merge),
            "read_s": min(read)}


def tap_cost(repeat: int) -> dict[str, float]:
    """Seconds per message of ``ProfileFetcher.tap``: messages of other kinds, and
    ``run`` messages (noted)."""
    from dask_otel_spans.config import PluginConfig
    from dask_otel_spans.protocol import events
    from dask_otel_spans.scheduler.profiles import ProfileFetcher

    config = PluginConfig.from_dask_config(profile_enabled=True)
    fetcher = ProfileFetcher(SimpleNamespace(extensions={}), SimpleNamespace(), config)
    others = [events.group_counts([("s", 1, 4, 0, 1, 2)])] * 1000
    runs = [events.group_running(f"s{i}", i, "inc") for i in range(1000)]
    out = {}
    for name, batch in (("other", others), ("run", runs)):
        best = float("inf")
        for _ in range(repeat):
            t0 = time.thread_time()
            fetcher.tap(batch)
            best = min(best, time.thread_time() - t0)
        out[name] = best / len(batch)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    repeat = 2 if args.quick else args.repeat
    cycles = recorded_cycles(3.0 if args.quick else 20.0)
    print(f"recorded cycles: {len(cycles)}, samples per cycle: "
          f"{statistics.median(c['count'] for _, c in cycles):.0f} (median)")
    for n in ((60,) if args.quick else (60, 600)):
        r = serving(cycles, n, repeat)
        print(f"worker: get_profile over {n} cycles: {r['cpu_s'] * 1e3:.1f} ms CPU "
              f"(best of {repeat}; median {r['median_cpu_s'] * 1e3:.1f} ms), "
              f"{r['bytes'] / 1e3:.1f} kB answer, {r['samples']} samples, "
              f"{r['nodes']} nodes; decoding it (the scheduler's event loop, as for "
              f"Client.profile): {r['decode_s'] * 1e3:.1f} ms; distributed's "
              f"profile.merge (Scheduler.get_profile's next step on the event loop): "
              f"{r['merge_s'] * 1e3:.1f} ms per answer; read and merged in the export "
              f"process: {r['read_s'] * 1e3:.1f} ms")
    t = tap_cost(repeat)
    print(f"scheduler: tap {t['other'] * 1e9:.0f} ns per message of another kind, "
          f"{t['run'] * 1e9:.0f} ns per run message (best of {repeat})")


if __name__ == "__main__":
    main()

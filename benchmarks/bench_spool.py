"""The spool's own cost on disk: writing held batches (each at once, ``spool.max-memory:
0``) and taking over, at the next start, what an export that ended left, for its own
destination and for another one (left in place).

    python benchmarks/bench_spool.py --batches 5000 --size 4096 --repeat 3

Prints microseconds per batch, the best of ``--repeat`` runs, in a fresh temporary
directory each time."""
from __future__ import annotations

import argparse
import json
import logging
import shutil
import tempfile
import time


def run(batches: int, size: int) -> dict[str, float]:
    from dask_otel_spans.sdk.destination import Destination
    from dask_otel_spans.sdk.spool import Spool

    own = Destination.of("traces", "grpc", "http://collector-a:4317", {"api-key": "a"})
    other = Destination.of("traces", "grpc", "http://collector-b:4317", {"api-key": "b"})
    payload = b"x" * size
    directory = tempfile.mkdtemp()
    try:
        out = {}
        for destination in (own, other):
            left = Spool(directory, max_memory=0, max_disk=2**62)
            left.open()
            t0 = time.perf_counter()
            for _ in range(batches):
                left.put(destination, payload, 10)
            out.setdefault("write_us", (time.perf_counter() - t0) / batches * 1e6)
            left.close()
        spool = Spool(directory, max_memory=0, max_disk=2**62)
        t0 = time.perf_counter()
        spool.open(lambda signal, key, found: own if key == own.key else None)
        # (both destinations' files looked at; only the own ones moved)
        out["takeover_us"] = (time.perf_counter() - t0) / (2 * batches) * 1e6
        assert spool.figures(own.key)["spooled"] == 10 * batches
        assert [found.batches for found in spool.left] == [batches]
        spool.close()
        return out
    finally:
        shutil.rmtree(directory)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=5000)
    parser.add_argument("--size", type=int, default=4096, help="bytes per batch")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    logging.disable(logging.CRITICAL)
    runs = [run(args.batches, args.size) for _ in range(args.repeat)]
    print(json.dumps({name: round(min(r[name] for r in runs), 1) for name in runs[0]}))


if __name__ == "__main__":
    main()

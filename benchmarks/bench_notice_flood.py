"""One client's flood of close notices: 100,000 from client A (batches of 100, as an
asynchronous client sends them; blocks without tasks), A staying connected; the
scheduler's and the export process's RSS and CPU, and how long another client B's
``wait_for_export`` (timeout 30 s) takes for one task submitted after the flood.

    python benchmarks/bench_notice_flood.py           # notices of blocks closed
    LAZY=1 python benchmarks/bench_notice_flood.py    # that say lazy (lazy-timeout)

A real ``dask scheduler --preload dask_otel_spans`` (export process, the embedded
default's files) and one worker (tests/support/processes.py).
"""
from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
import uuid

import psutil

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

from distributed import Client  # noqa: E402
from support.processes import DaskProcesses  # noqa: E402

from dask_otel_spans import names, wait_for_export  # noqa: E402

N, BATCH = 100_000, 100
LAZY = os.environ.get("LAZY") == "1"


def figures(procs: DaskProcesses) -> str:
    """RSS (MiB) and CPU (s) of the scheduler and of its export process."""
    sched = psutil.Process(procs.scheduler.pid)
    kids = sched.children(recursive=True)
    return (f"scheduler {sched.memory_info().rss >> 20} MiB "
            f"{sum(sched.cpu_times()[:2]):.1f} s CPU; export process "
            + ", ".join(f"{k.memory_info().rss >> 20} MiB {sum(k.cpu_times()[:2]):.1f} s CPU"
                        for k in kids))


def notices(client_id: str) -> list[list[dict[str, object]]]:
    now = time.time()
    every = [{"ids": [str(uuid.uuid4())], "name": ["x"], "opened": 1, "enter": now,
              "exit": now, "lazy": LAZY, "client": client_id} for _ in range(N)]
    return [every[i:i + BATCH] for i in range(0, N, BATCH)]


async def timed_wait(client: Client) -> str:
    t0 = time.time()
    state = await wait_for_export(client, timeout=30)
    return (f"{time.time() - t0:.2f} s (open {state.open}, handed over "
            f"{state.handed_over})")


async def run(procs: DaskProcesses) -> None:
    async with Client(procs.address, asynchronous=True) as b, \
            Client(procs.address, asynchronous=True) as a:
        assert await b.submit(lambda: 1) == 1
        print("B's wait before the flood:", await timed_wait(b))
        print("before:", figures(procs))
        t0 = time.time()
        batches = notices(a.id)
        for i in range(0, len(batches), 200):
            await asyncio.gather(*[a.log_event(names.EVENT_TOPIC, batch)
                                   for batch in batches[i:i + 200]])
        print(f"flood sent in {time.time() - t0:.2f} s:", figures(procs))
        assert await b.submit(lambda x: x + 1, 1) == 2
        print("B's wait after the flood:", await timed_wait(b))
        print("after:", figures(procs))


def main() -> None:
    out = tempfile.mkdtemp()
    procs = DaskProcesses({"DASK_OTEL_SPANS__OUTPUT_DIR": out}, cwd=out, workers=1)
    try:
        asyncio.run(run(procs))
    finally:
        log = procs.stop()
        print("\n".join(line for line in log.splitlines()
                        if "dask_otel_spans" in line and "WARNING" in line))


if __name__ == "__main__":
    main()

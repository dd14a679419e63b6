"""Scheduler preload of ``bench_memory.py --traced``: the package as shipped, its
export process started with ``PYTHONTRACEMALLOC=1`` (its figures then carry its
Python allocations alive), the scheduler process itself not traced."""
from __future__ import annotations

import os
from typing import Any

import dask_otel_spans


def dask_setup(scheduler: Any) -> Any:
    # (read by the export process's interpreter when it starts; this process's
    # started untraced)
    os.environ["PYTHONTRACEMALLOC"] = "1"
    return dask_otel_spans.dask_setup(scheduler)

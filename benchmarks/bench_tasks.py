"""The benchmarks' task function, in a module of its own: a scheduler unpickles the
graphs it is sent, and so imports the module of their functions (``bench_scheduler``
would bring ``bench_preload`` and the OTel SDK into every scheduler, baselines too)."""
from __future__ import annotations


def inc(x: int) -> int:
    return x + 1

"""Task functions the profile tests run: ``hot_loop`` burns CPU in a known function,
so a profile names it (importable on real workers: tests/ is on their path)."""
from __future__ import annotations

import time


def hot_loop(seconds: float) -> int:
    """Burn CPU in this very frame for ``seconds``."""
    end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < end:
        n += 1
    return n

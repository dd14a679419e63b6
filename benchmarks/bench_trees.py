"""Running a benchmark's measure on two source trees (git worktrees of two versions
of the package), each in a fresh interpreter, in alternating rounds."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def run_in_tree(tree: str, code: str) -> Any:
    """Run ``code`` (which prints JSON on its last line) in a fresh interpreter with
    ``tree`` first on ``sys.path``, then the benchmarks; what it printed, decoded."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [tree, str(HERE)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                             if p]))
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                         capture_output=True, text=True, cwd=str(HERE)).stdout
    return json.loads(out.strip().splitlines()[-1])


def alternate(trees: list[str], rounds: int,
              run: Callable[[str], Any]) -> dict[str, list[Any]]:
    """``run(tree)`` for each tree once per round, the order reversed every other
    round; the results by tree, in round order."""
    results: dict[str, list[Any]] = {tree: [] for tree in trees}
    for i in range(rounds):
        for tree in trees if i % 2 == 0 else trees[::-1]:
            results[tree].append(run(tree))
    return results

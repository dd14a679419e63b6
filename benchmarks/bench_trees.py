"""Running a benchmark's measure on two source trees (git worktrees of two versions
of the package), each in a fresh interpreter, in alternating rounds."""
from __future__ import annotations

import argparse
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


def runs_by_tree(args: argparse.Namespace, here: str,
                 run: Callable[[str], Any]) -> dict[str, list[Any]]:
    """``run(here)`` once, without ``--against``; with it, ``run`` on this tree and on
    that one in ``--rounds`` alternating rounds. The results by tree, in round order
    (this tree first)."""
    if args.against is None:
        return {here: [run(here)]}
    trees = [here, str(Path(args.against).resolve())]
    return alternate(trees, args.rounds, run)


def add_tree_arguments(parser: argparse.ArgumentParser, rounds: int) -> None:
    """The options both tree benchmarks take: the nested tree's scale, another tree
    to run against, and how many alternating rounds."""
    parser.add_argument("--scale", default="10,10,20",
                        help="a,b,c: a x b x c leaf spans (default 10,10,20)")
    parser.add_argument("--against", metavar="TREE",
                        help="source tree of another version of the package (a git "
                        "worktree): both run in alternating rounds")
    parser.add_argument("--rounds", type=int, default=rounds,
                        help="rounds with --against (each tree once per round)")


def scale_of(args: argparse.Namespace) -> tuple[int, int, int]:
    """``--scale`` as its three numbers."""
    a, b, c = (int(x) for x in args.scale.split(","))
    return a, b, c

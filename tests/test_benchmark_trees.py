"""Two trees' benchmark runs alternate, each in an interpreter of its own tree."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
from bench_trees import alternate, run_in_tree, runs_by_tree  # noqa: E402


def test_trees_take_turns_going_first_round_by_round():
    order = []
    results = alternate(["a", "b"], 3, lambda tree: order.append(tree) or len(order))
    assert order == ["a", "b", "b", "a", "a", "b"]
    assert results == {"a": [1, 4, 5], "b": [2, 3, 6]}


def test_without_another_tree_this_one_runs_once():
    args = argparse.Namespace(against=None, rounds=5)
    assert runs_by_tree(args, "here", lambda tree: tree.upper()) == {"here": ["HERE"]}


def test_with_another_tree_both_run_in_alternating_rounds(tmp_path):
    args = argparse.Namespace(against=str(tmp_path), rounds=2)
    order = []
    results = runs_by_tree(args, "here", lambda tree: order.append(tree) or len(order))
    other = str(tmp_path.resolve())
    assert order == ["here", other, other, "here"]
    assert results == {"here": [1, 4], other: [2, 3]}


def test_code_runs_with_the_trees_package_first_on_its_path(tmp_path):
    package = tmp_path / "dask_otel_spans"
    package.mkdir()
    (package / "__init__.py").write_text("WHICH = 'the other tree'\n")
    assert run_in_tree(str(tmp_path), "import json, dask_otel_spans; "
                       "print(json.dumps(dask_otel_spans.WHICH))") == "the other tree"

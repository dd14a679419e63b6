"""The sender benchmark times the real export sender of a real scheduler, per span."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
from bench_sender import FIGURES, run_tree  # noqa: E402


def test_a_round_reports_every_figure_per_span_handed_over():
    """In a fresh interpreter with this tree first on its path, as ``--against``
    runs each tree: 1 x 1 x 2 leaf spans, their 2 ancestors and the span of the
    gather that computes them, per run."""
    [first, second] = run_tree(str(Path(__file__).parent.parent), 2, 1, 1, 2)
    for run in (first, second):
        assert run["spans"] == 5
        assert set(FIGURES) <= set(run)
        assert run["cpu"] > 0 and run["encode"] > 0 and run["dumps"] > 0
        assert run["dumps"] <= run["encode"]
        assert run["bytes"] > 100 and run["frames"] > 0

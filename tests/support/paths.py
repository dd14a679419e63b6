"""The repository's folders the tests read."""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "dask_otel_spans"
EXAMPLES = REPO / "examples"
DEPLOY = REPO / "deploy"
BENCHMARKS = REPO / "benchmarks"

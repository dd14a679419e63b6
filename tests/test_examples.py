"""The examples the README shows run as written."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from dask_otel_spans.otlpjson import read_spans

EXAMPLES = Path(__file__).parent.parent / "examples"


def test_quickstart_writes_its_span_tree(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "quickstart.py"), str(tmp_path / "out")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    spans = {s["name"]: s for s in read_spans(str(tmp_path / "out" / "traces.jsonl"))}
    assert spans["load"]["parentSpanId"] == spans["quickstart"]["spanId"]
    assert spans["reduce"]["parentSpanId"] == spans["quickstart"]["spanId"]
    assert spans["load"]["attributes"]["dask.span.task_count"] == 16

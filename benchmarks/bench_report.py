"""The report at size: 10,000 spans (dask spans, their prefix spans and task spans, in
20 traces), the report written, then opened in a real headless Chromium: the page's
render time (its script's own clock, ``data-render-ms``), Chromium's wall time to load
and dump it, and the file's size.

    python benchmarks/bench_report.py                  # 10,000 spans
    python benchmarks/bench_report.py --spans 2000
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid

from dask_otel_spans import names
from dask_otel_spans.reports.model import build
from dask_otel_spans.reports.render import render

HERE = os.path.dirname(os.path.abspath(__file__))


def synthetic(n_spans: int, traces: int = 20, tasks_per_prefix: int = 3) -> list[dict]:
    """Spans shaped like a run's: per trace a root dask span, child dask spans, a
    prefix span each and task spans below (every fourth erred), until ``n_spans``."""
    spans: list[dict] = []
    t0 = time.time_ns()
    per_trace = n_spans // traces
    for t in range(traces):
        trace_id = uuid.uuid4().hex
        root = uuid.uuid4().hex[:16]
        spans.append(_span(trace_id, root, "", f"workflow {t}", t0, t0 + 10**10,
                           {names.SPAN_ID: root, names.SPAN_TASK_COUNT: 100,
                            "dask.metrics.thread-cpu.seconds": 3.0,
                            "dask.metrics.transfer.seconds": 1.0}))
        i = 0
        while len(spans) < (t + 1) * per_trace:
            child = uuid.uuid4().hex[:16]
            start = t0 + i * 10**6
            spans.append(_span(trace_id, child, root, f"step {i}", start, start + 5 * 10**6,
                               {names.SPAN_ID: child, names.SPAN_TASK_COUNT: 3,
                                "dask.metrics.thread-cpu.seconds": 0.01,
                                "dask.metrics.executor.seconds": 0.002}))
            prefix = uuid.uuid4().hex[:16]
            spans.append(_span(trace_id, prefix, child, "inc", start, start + 4 * 10**6,
                               {names.TASK_PREFIX: "inc", names.TASK_GROUP_COUNT: 1,
                                "dask.metrics.thread-cpu.seconds": 0.01}))
            for k in range(tasks_per_prefix):
                task = uuid.uuid4().hex[:16]
                erred = (i + k) % 4 == 0
                spans.append(_span(trace_id, task, prefix, "inc", start, start + 10**6,
                                   {names.TASK_KEY: f"inc-{i}-{k}", names.TASK_PREFIX: "inc"},
                                   erred))
            i += 1
    return spans[:n_spans]


def _span(trace_id, span_id, parent, name, start, end, attrs, erred=False) -> dict:
    events = [{"name": names.EXCEPTION_EVENT, "attributes": [
        {"key": names.EXCEPTION_TYPE, "value": {"stringValue": "ValueError"}},
        {"key": names.EXCEPTION_MESSAGE, "value": {"stringValue": "bad record"}},
        {"key": names.EXCEPTION_STACKTRACE, "value": {"stringValue": "Traceback ..."}}]}
    ] if erred else []
    return {"traceId": trace_id, "spanId": span_id, "parentSpanId": parent, "name": name,
            "startTimeUnixNano": str(start), "endTimeUnixNano": str(end),
            "attributes": attrs, "resource": {}, "events": events, "status": {}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=10_000)
    args = parser.parse_args(argv)
    spans = synthetic(args.spans)
    t = time.perf_counter()
    page = render(build(spans))
    made_s = time.perf_counter() - t
    with tempfile.TemporaryDirectory() as where:
        path = os.path.join(where, "report.html")
        with open(path, "w", encoding="utf-8") as f:
            f.write(page)
        t = time.perf_counter()
        dom = subprocess.run(
            ["chromium", "--headless", "--no-sandbox", "--disable-gpu",
             "--virtual-time-budget=30000", "--dump-dom", f"file://{path}"],
            capture_output=True, text=True, timeout=300, check=True).stdout
        browser_s = time.perf_counter() - t
    render_ms = float(re.search(r'data-render-ms="([\d.]+)"', dom).group(1))
    rows = dom.count('class="row ')
    print(f"report of {len(spans):,} spans: built and rendered to HTML in {made_s:.2f} s; "
          f"{len(page) / 1e6:.2f} MB; in Chromium its script drew {rows:,} rows in "
          f"{render_ms / 1000:.2f} s (Chromium's whole load and dump {browser_s:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

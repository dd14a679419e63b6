"""The export session's pure helpers."""
from __future__ import annotations

from dask_otel_spans.export.session import span_tags_of

ROOT_ID = "6f1c1e9e-3b0a-4f57-9a49-2f6d1c3f0a11"
CHILD_ID = "0d9a8e77-51c4-4c6b-8c3e-7a5b2d1e9f22"


def test_span_tags_of_names_only_the_spans_in_the_deltas():
    tags = {ROOT_ID: ["wf"], CHILD_ID: ["wf", "child"], "other": ["x"]}
    deltas = {
        ("execute", CHILD_ID, "inc", "thread-cpu", "seconds"): 1.0,
        ("execute", CHILD_ID, "inc", "thread-noncpu", "seconds"): 0.5,
        ("execute", "unknown-id", "inc", "thread-cpu", "seconds"): 0.1,
        ("execute", 42, "inc", "thread-cpu", "seconds"): 0.1,
        "not a tuple": 1.0,
        ("short",): 1.0,
    }
    assert span_tags_of(deltas, tags) == {CHILD_ID: ("wf", "child")}

"""The OTel context of a task, from its dask span and annotations (pure: no cluster)."""
from __future__ import annotations

import uuid

from opentelemetry import trace

from dask_otel_spans.protocol.propagation import otel_trace_id, prefix_span_id
from dask_otel_spans.worker import context as task_context
from dask_otel_spans.worker.context import TaskContexts

ROOT, CHILD = str(uuid.uuid4()), str(uuid.uuid4())
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def ids_of(ctx) -> tuple[int, int]:
    sc = trace.get_current_span(ctx).get_span_context()
    return sc.trace_id, sc.span_id


def test_the_chain_of_the_span_annotation_gives_the_root_trace():
    ctx = TaskContexts().context_of(
        CHILD, "inc", {"span": {"name": ("a", "b"), "ids": (ROOT, CHILD)}}
    )
    assert ids_of(ctx) == (otel_trace_id(ROOT), prefix_span_id(CHILD, "inc"))


def test_the_carried_client_context_gives_the_trace():
    ctx = TaskContexts().context_of(
        CHILD, "inc", {"span": {"ids": (ROOT, CHILD)},
                       "otel": {ROOT: {"traceparent": TRACEPARENT}, CHILD: {}}},
    )
    assert ids_of(ctx)[0] == 0x0AF7651916CD43DD8448EB211C80319C


def test_a_malformed_otel_annotation_falls_back_to_the_root_trace():
    ctx = TaskContexts().context_of(CHILD, "inc", {"span": {"ids": (ROOT, CHILD)},
                                                   "otel": ["not", "a", "mapping"]})
    assert ids_of(ctx)[0] == otel_trace_id(ROOT)


def test_a_task_of_no_span_gets_no_context():
    assert TaskContexts().context_of(None, "inc", {}) is None


def test_a_context_is_worked_out_once_per_span_and_prefix():
    contexts = TaskContexts()
    first = contexts.context_of(CHILD, "inc", {"span": {"ids": (ROOT, CHILD)}})
    assert contexts.context_of(CHILD, "inc", None) is first


def test_the_contexts_remembered_are_bounded(monkeypatch):
    monkeypatch.setattr(task_context, "MAX_CONTEXTS", 3)
    contexts = TaskContexts()
    for i in range(10):
        contexts.context_of(ROOT, f"p{i}", {})
    assert len(contexts) == 3

"""The OTel context of a task, from its dask span and annotations (pure: no cluster)."""
from __future__ import annotations

import uuid

from opentelemetry import baggage, trace

from dask_otel_spans.protocol.propagation import otel_trace_id, prefix_span_id
from dask_otel_spans.worker import context as task_context
from dask_otel_spans.worker.context import TaskContexts, carried_by_submissions

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


CALLER = {"traceparent": TRACEPARENT, "baggage": "tenant=acme"}


def test_a_bare_submissions_task_runs_in_its_callers_span_with_its_baggage():
    ctx = TaskContexts().context_of(ROOT, "inc", {"otel-caller": CALLER})
    assert ids_of(ctx) == (0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331)
    assert baggage.get_all(ctx) == {"tenant": "acme"}


def test_a_span_blocks_task_keeps_its_prefix_span_and_gets_the_callers_baggage():
    ctx = TaskContexts().context_of(
        CHILD, "inc", {"span": {"ids": (ROOT, CHILD)}, "otel": {ROOT: {}, CHILD: {}},
                       "otel-caller": CALLER})
    assert ids_of(ctx) == (otel_trace_id(ROOT), prefix_span_id(CHILD, "inc"))
    assert baggage.get_all(ctx) == {"tenant": "acme"}


def test_tasks_of_different_callers_get_their_own_callers_context():
    contexts = TaskContexts()
    other = {"traceparent": TRACEPARENT.replace("b7ad", "c7ad")}
    first = contexts.context_of(ROOT, "inc", {"otel-caller": CALLER})
    second = contexts.context_of(ROOT, "inc", {"otel-caller": other})
    assert ids_of(first)[1] != ids_of(second)[1] == 0xC7AD6B7169203331
    assert contexts.context_of(ROOT, "inc", {"otel-caller": dict(CALLER)}) is first


def test_a_malformed_caller_leaves_the_tasks_own_context():
    contexts = TaskContexts()
    own = contexts.context_of(ROOT, "inc", {})
    for caller in ("not a carrier", {"traceparent": "garbage"}, {"traceparent": 7}):
        ctx = contexts.context_of(ROOT, "inc", {"otel-caller": caller})
        assert ids_of(ctx) == ids_of(own)
        assert baggage.get_all(ctx) == {}


def test_a_caller_carrier_too_large_to_remember_is_worked_out_each_time():
    contexts = TaskContexts()
    huge = {**CALLER, "x-padding": "p" * 10_000}
    ctx = contexts.context_of(ROOT, "inc", {"otel-caller": huge})
    assert ids_of(ctx)[1] == 0xB7AD6B7169203331
    assert len(contexts) == 0


def test_task_codes_submissions_carry_the_tasks_otel_chain():
    chain = {ROOT: {"traceparent": TRACEPARENT}, CHILD: {}}
    got = carried_by_submissions({"span": {"ids": (ROOT, CHILD)}, "otel": chain,
                                  "otel-caller": CALLER, "priority": 3})
    assert got == {"otel": chain}


def test_a_task_of_no_span_or_of_no_wellformed_chain_passes_nothing_on():
    assert carried_by_submissions(None) is None
    assert carried_by_submissions({"otel-caller": CALLER}) is None
    assert carried_by_submissions({"otel": {ROOT: {}}}) is None  # (no span)
    for malformed in ("not a chain", {}, ["a"]):
        assert carried_by_submissions({"span": {"ids": (ROOT,)},
                                       "otel": malformed}) is None

"""The OTel specification's environment carriers: with no current span, ``span()``
takes its parent from ``TRACEPARENT`` / ``TRACESTATE`` / ``BAGGAGE``, as the global
propagator reads them; a malformed ``TRACEPARENT`` is one warning, and ignored."""
from __future__ import annotations

import logging

import dask
import pytest
from opentelemetry import baggage, propagate, trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.context import Context
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.sdk.trace import TracerProvider

from dask_otel_spans import names, span
from dask_otel_spans.client import context, context_from_environment
from dask_otel_spans.logonce import OnceLogger
from dask_otel_spans.protocol.propagation import span_context_from_carrier

TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
SPAN_ID = 0x00F067AA0BA902B7
TRACEPARENT = f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-01"


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    """Each test sees the client's once-only warnings afresh."""
    monkeypatch.setattr(context, "_log_once", OnceLogger(context.logger))


def span_context(ctx: Context):
    return trace.get_current_span(ctx).get_span_context()


def carried(dask_id: str) -> dict[str, str]:
    """The W3C carrier ``span()`` put in the ``otel`` annotation for its block."""
    return dask.get_annotations()[names.ANNOTATION_KEY][dask_id]


def test_the_three_variables_are_extracted():
    ctx = context_from_environment(Context(), environ={
        "TRACEPARENT": TRACEPARENT, "TRACESTATE": "vendor=value",
        "BAGGAGE": "tenant=alice,job=nightly"})
    found = span_context(ctx)
    assert (found.trace_id, found.span_id, found.is_remote) == (TRACE_ID, SPAN_ID, True)
    assert found.trace_flags.sampled
    assert found.trace_state.get("vendor") == "value"
    assert baggage.get_all(ctx) == {"tenant": "alice", "job": "nightly"}


def test_without_the_variables_the_context_is_unchanged():
    ctx = Context()
    assert context_from_environment(ctx, environ={"PATH": "/bin"}) is ctx
    assert context_from_environment(ctx, environ={"TRACEPARENT": ""}) is ctx


def test_a_malformed_traceparent_is_one_warning_and_ignored(caplog):
    environ = {"TRACEPARENT": "00-not-a-traceparent", "BAGGAGE": "tenant=alice"}
    with caplog.at_level(logging.WARNING, logger="dask_otel_spans"):
        first = context_from_environment(Context(), environ=environ)
        second = context_from_environment(Context(), environ=environ)
    for ctx in (first, second):
        assert not span_context(ctx).is_valid
        assert baggage.get_baggage("tenant", ctx) == "alice"  # (the rest still read)
    [warning] = [r.getMessage() for r in caplog.records]
    assert "TRACEPARENT '00-not-a-traceparent' is not a W3C traceparent" in warning


def test_the_global_propagator_decides_what_is_read(caplog):
    """``OTEL_PROPAGATORS=baggage``: a valid ``TRACEPARENT`` is not read, and no
    warning either."""
    before = propagate.get_global_textmap()
    propagate.set_global_textmap(CompositePropagator([W3CBaggagePropagator()]))
    try:
        with caplog.at_level(logging.WARNING, logger="dask_otel_spans"):
            ctx = context_from_environment(Context(), environ={
                "TRACEPARENT": TRACEPARENT, "BAGGAGE": "tenant=alice"})
    finally:
        propagate.set_global_textmap(before)
    assert not span_context(ctx).is_valid
    assert baggage.get_baggage("tenant", ctx) == "alice"
    assert not caplog.records


def test_span_hangs_under_the_environment_traceparent(monkeypatch):
    """A batch script started with ``TRACEPARENT``: its dask span's carried parent
    is the orchestrator's span; inside the block the current span is the dask span's
    own, in that trace, and the baggage is the environment's."""
    monkeypatch.setenv("TRACEPARENT", TRACEPARENT)
    monkeypatch.setenv("TRACESTATE", "vendor=value")
    monkeypatch.setenv("BAGGAGE", "tenant=alice")
    with span("batch") as dask_id:
        parent = span_context_from_carrier(carried(dask_id))
        inside = trace.get_current_span().get_span_context()
        assert baggage.get_baggage("tenant") == "alice"
    assert baggage.get_baggage("tenant") is None  # (nothing left attached)
    assert (parent.trace_id, parent.span_id) == (TRACE_ID, SPAN_ID)
    assert parent.trace_state.get("vendor") == "value"
    assert inside.trace_id == TRACE_ID and inside.span_id != SPAN_ID


def test_a_current_span_wins_over_the_environment(monkeypatch):
    monkeypatch.setenv("TRACEPARENT", TRACEPARENT)
    tracer = TracerProvider().get_tracer("app")
    with tracer.start_as_current_span("request") as request:
        with span("in request") as dask_id:
            parent = span_context_from_carrier(carried(dask_id))
    assert parent.trace_id == request.get_span_context().trace_id != TRACE_ID
    assert parent.span_id == request.get_span_context().span_id


def test_a_span_does_not_write_the_environment(monkeypatch):
    import os

    monkeypatch.setenv("TRACEPARENT", TRACEPARENT)
    before = dict(os.environ)
    with span("read only"):
        pass
    assert dict(os.environ) == before

"""What crosses the pipe to the export process, without a process: frames and
self-contained copies of span snapshots and heartbeat deltas."""
from __future__ import annotations

import io
import pickle

import pytest
from opentelemetry.trace import SpanContext, TraceFlags, TraceState

from dask_otel_spans.emitter import EmitRequest, SpanEmitter
from dask_otel_spans.snapshot import GroupSnapshot, SpanSnapshot
from dask_otel_spans.traces import active_cpu_seconds
from dask_otel_spans.wire import (
    portable_request,
    read_frame,
    restored_request,
    span_tags_of,
    write_frame,
)

ROOT_ID = "6f1c1e9e-3b0a-4f57-9a49-2f6d1c3f0a11"
CHILD_ID = "0d9a8e77-51c4-4c6b-8c3e-7a5b2d1e9f22"

#: the scheduler's total_nthreads_history: (time, threads)
HISTORY = [(float(t), 2 + t % 3) for t in range(10)]


def snapshot(span_id, name, offset, children=(), start=4.0, stop=8.5):
    return SpanSnapshot(
        id=span_id,
        name=name,
        enqueued=start,
        groups=(GroupSnapshot("inc", start, stop, 100, 0.5, 3, 0),),
        metrics={("execute", "inc", "thread-cpu", "seconds"): 0.25},
        children=children,
        code=(),
        nthreads_history=HISTORY,
        nthreads_offset=offset,
    )


def request(snap) -> EmitRequest:
    return EmitRequest(
        tags=snap.name, ids=(snap.id,), carried={}, snapshot=snap, now=9.0,
        complete=True, close_reason="client",
    )


def test_frames_round_trip_and_end_with_eof():
    stream = io.BytesIO()
    write_frame(stream, [("emit", 1)])
    write_frame(stream, {"b": 2})
    stream.seek(0)
    assert read_frame(stream) == [("emit", 1)]
    assert read_frame(stream) == {"b": 2}
    with pytest.raises(EOFError):
        read_frame(stream)


def test_frame_cut_short_is_eof():
    stream = io.BytesIO()
    write_frame(stream, "x" * 100)
    stream = io.BytesIO(stream.getvalue()[:-10])
    with pytest.raises(EOFError):
        read_frame(stream)


def test_portable_request_copies_history_from_the_oldest_offset_only():
    child = snapshot(CHILD_ID, ("wf", "child"), offset=3, start=3.5, stop=6.0)
    root = snapshot(ROOT_ID, ("wf",), offset=5, children=(child, "emitted-earlier"))
    portable = portable_request(request(root)).snapshot
    assert portable.nthreads_history == tuple(HISTORY[3:])
    assert portable.nthreads_offset == 2
    copied_child, emitted = portable.children
    assert copied_child.nthreads_offset == 0
    assert copied_child.nthreads_history is portable.nthreads_history  # pickled once
    assert emitted == "emitted-earlier"


def test_portable_request_keeps_active_cpu_seconds():
    child = snapshot(CHILD_ID, ("wf", "child"), offset=3, start=3.5, stop=6.0)
    before = active_cpu_seconds(HISTORY, 3, 3.5, 6.0)
    after = portable_request(request(child)).snapshot
    assert active_cpu_seconds(after.nthreads_history, after.nthreads_offset, 3.5, 6.0) \
        == pytest.approx(before)
    assert before > 0


def test_portable_request_translates_like_the_original():
    child = snapshot(CHILD_ID, ("wf", "child"), offset=3, start=3.5, stop=6.0)
    root = snapshot(ROOT_ID, ("wf",), offset=5, children=(child,))
    emitter = SpanEmitter(None)
    original, _ = emitter.translate(request(root))
    copied = pickle.loads(pickle.dumps(portable_request(request(root))))
    translated, _ = SpanEmitter(None).translate(copied)
    assert translated.attributes == original.attributes
    assert (translated.start_ns, translated.end_ns) == (original.start_ns, original.end_ns)


def test_carried_span_contexts_cross_as_plain_tuples_and_come_back_equal():
    """Carried contexts cross the pipe as tuples of numbers and a string (cheap to
    pickle) and are SpanContexts again on the other side, translating alike."""
    client_span = SpanContext(
        trace_id=0x1234, span_id=0x5678, is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
        trace_state=TraceState([("vendor", "v1"), ("other", "x")]),
    )
    root = snapshot(ROOT_ID, ("wf",), offset=5)
    original = EmitRequest(
        tags=("wf",), ids=(ROOT_ID,), carried={ROOT_ID: client_span, "x": None},
        snapshot=root, now=9.0, complete=True, close_reason="client",
    )
    portable = portable_request(original)
    assert all(type(ctx) in (tuple, type(None)) for ctx in portable.carried.values())
    restored = restored_request(pickle.loads(pickle.dumps(portable)))
    assert restored.carried == original.carried
    assert restored.carried[ROOT_ID].trace_state == client_span.trace_state
    before, _ = SpanEmitter(None).translate(original)
    after, _ = SpanEmitter(None).translate(restored)
    assert after.ids == before.ids
    assert after.ids.trace_id == 0x1234 and after.ids.parent_span_id == 0x5678


def test_request_of_a_span_the_scheduler_never_saw_travels_as_is():
    unseen = EmitRequest(
        tags=("lazy",), ids=(ROOT_ID,), carried={}, snapshot=None, now=1.0,
        complete=True, close_reason="client", enter=0.5, exit=0.9,
    )
    assert portable_request(unseen) is unseen


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

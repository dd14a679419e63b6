"""What crosses the pipe to the export process, without a process: frames, carried
W3C headers, the copy of the threads history, and heartbeat deltas."""
from __future__ import annotations

import io
import pickletools

import pytest
from opentelemetry.trace import SpanContext, TraceFlags, TraceState

from dask_otel_spans import names
from dask_otel_spans.config import PluginConfig
from dask_otel_spans.emitter import EmitRequest, SpanEmitter
from dask_otel_spans.export_process import ExportProcess
from dask_otel_spans.pipeline import PipelineSpec
from dask_otel_spans.propagation import carrier_for
from dask_otel_spans.snapshot import GroupSnapshot, SpanSnapshot
from dask_otel_spans.wire import (
    MIRRORED_HISTORY,
    encode_batch,
    encode_frame,
    mirror_history,
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


def test_the_sender_sends_the_history_entries_the_child_lacks_only():
    process = ExportProcess(PipelineSpec(PluginConfig(), environ={}))  # not started
    history = list(HISTORY)
    process.nthreads_history = history
    message, length = process._new_history()
    assert message == [("history", 0, tuple(HISTORY))] and length == 10
    process._history_sent = length  # the frame was written
    assert process._new_history() == ([], 10)
    history.append((10.0, 4))
    assert process._new_history() == ([("history", 10, ((10.0, 4),))], 11)


def test_the_childs_copy_of_the_history_takes_a_message_sent_again_as_once():
    mirror: list = []
    mirror_history(mirror, 0, HISTORY[:6])
    mirror_history(mirror, 6, HISTORY[6:])
    mirror_history(mirror, 6, HISTORY[6:])  # a frame written again
    assert mirror == HISTORY


def test_a_snapshot_with_mirrored_history_translates_in_the_child_like_the_original():
    """A snapshot sent with MIRRORED_HISTORY (no reference to the scheduler's list)
    reads the export process's copy of it there: same active CPU, same idle time."""
    child = snapshot(CHILD_ID, ("wf", "child"), offset=3, start=3.5, stop=6.0)
    root = snapshot(ROOT_ID, ("wf",), offset=5, children=(child,))
    original, _ = SpanEmitter(None).translate(request(root))

    mirrored = root._replace(nthreads_history=MIRRORED_HISTORY)
    sent = read_frame(io.BytesIO(encode_frame([request(mirrored)])))[0]
    mirror: list = []
    mirror_history(mirror, 0, tuple(HISTORY))
    translated, _ = SpanEmitter(None).translate(restored_request(sent, mirror))
    assert translated.attributes == original.attributes
    assert (translated.start_ns, translated.end_ns) == (original.start_ns, original.end_ns)
    assert translated.attributes[names.SPAN_ACTIVE_CPU_SECONDS] > 0


def test_carried_headers_cross_as_strings_and_give_the_same_ids():
    """The W3C headers a request carries cross as their strings (the scheduler
    never parses them) and give the same OTel ids on the other side."""
    client_span = SpanContext(
        trace_id=0x1234, span_id=0x5678, is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
        trace_state=TraceState([("vendor", "v1"), ("other", "x")]),
    )
    headers = carrier_for(client_span)
    root = snapshot(ROOT_ID, ("wf",), offset=5)
    original = EmitRequest(
        tags=("wf",), ids=(ROOT_ID,), carried={ROOT_ID: headers},
        snapshot=root, now=9.0, complete=True, close_reason="client",
    )
    frame, back = _sent([("emits", [original])])
    received = back[0][1][0]
    assert received.carried == {ROOT_ID: headers}
    before, _ = SpanEmitter(None).translate(original)
    after, _ = SpanEmitter(None).translate(received)
    assert after.ids == before.ids
    assert after.ids.trace_id == 0x1234 and after.ids.parent_span_id == 0x5678
    assert after.ids.trace_state == client_span.trace_state


@pytest.mark.parametrize("odd", [
    pytest.param({}, id="empty"),
    pytest.param({"traceparent": 5}, id="not-a-string"),
    pytest.param({"traceparent": "00-" + "x" * 20_000}, id="too-long"),
    pytest.param(object(), id="no-mapping"),
])
def test_a_carrier_without_valid_w3c_headers_crosses_as_none(odd):
    """Whatever a client carried for a span crosses as its W3C header strings or
    None, and never keeps the batch from crossing."""
    headers = {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}
    sent = request(snapshot(CHILD_ID, ("wf", "step"), offset=2))._replace(
        ids=(ROOT_ID, CHILD_ID), carried={ROOT_ID: headers, CHILD_ID: odd}
    )
    frame, back = _sent([("emits", [sent])])
    assert back[0][1][0].carried == {ROOT_ID: headers, CHILD_ID: None}


def test_a_carrier_that_fails_to_be_read_crosses_as_none_with_its_span():
    """A client's mapping that raises when read, as a plain request's carrier: the
    batch still marshals, the span crosses with no context for it."""
    from test_propagation import UnreadableMapping

    named = request(snapshot(ROOT_ID, ("wf",), offset=2)._replace(
        nthreads_history=MIRRORED_HISTORY
    ))
    plain = tuple(named)[:2] + ({ROOT_ID: UnreadableMapping()}, None) + tuple(named)[4:]
    frame, back = _sent([("emits", [plain])])
    assert frame[4:5] == b"M"
    assert back[0][1][0].carried == {ROOT_ID: None}


def test_only_the_headers_the_translation_reads_cross():
    """A span's OTel ids come from its root's and its own carried contexts: the
    middle levels' headers stay behind."""
    headers = {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}
    middle = "middle-id"
    sent = request(snapshot(CHILD_ID, ("wf", "mid", "step"), offset=2))._replace(
        ids=(ROOT_ID, middle, CHILD_ID),
        carried={ROOT_ID: {}, middle: headers, CHILD_ID: headers},
    )
    frame, back = _sent([("emits", [sent])])
    received = back[0][1][0]
    assert received.carried == {ROOT_ID: None, CHILD_ID: headers}
    assert SpanEmitter(None).translate(received)[0].ids == (
        SpanEmitter(None).translate(sent)[0].ids
    )


def test_a_pickled_batch_carries_only_the_w3c_header_strings():
    """A batch that marshal cannot take is pickled with the carried headers as they
    cross in a marshalled one: an odd carrier never keeps it from pickling."""
    import threading

    unpicklable = {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01",
                   "lock": threading.Lock()}
    sent = request(snapshot(ROOT_ID, (Tag("wf"),), offset=2))._replace(
        carried={ROOT_ID: unpicklable}
    )
    frame, back = _sent([("emits", [sent])])
    assert frame[4:5] == b"B"
    assert back[0][1][0].carried == {ROOT_ID: {"traceparent": unpicklable["traceparent"]}}


def test_only_a_mirrored_history_is_replaced_by_the_childs_copy():
    """The marker crosses a frame as itself; any other history, empty or not, stays
    what the snapshot had."""
    mirror = list(HISTORY)
    mirrored = snapshot(ROOT_ID, ("wf",), offset=5)._replace(
        nthreads_history=MIRRORED_HISTORY
    )
    sent = read_frame(io.BytesIO(encode_frame(request(mirrored))))
    assert sent.snapshot.nthreads_history is MIRRORED_HISTORY
    assert restored_request(sent, mirror).snapshot.nthreads_history is mirror
    for own in ((), tuple(HISTORY[:2])):
        plain = request(mirrored._replace(nthreads_history=own))
        assert restored_request(plain, mirror) is plain


def test_requests_cross_a_frame_as_plain_tuples_and_come_back_equal():
    """A request, its snapshot and its task groups are pickled as their class and a
    tuple of their fields (no state to set after making the object: the named
    tuples' own reduction costs several times more on the sender)."""
    original = request(snapshot(ROOT_ID, ("wf",), offset=2))
    frame = encode_frame([original])
    assert frame[4:5] == b"P"
    ops = {op.name for op, _, _ in pickletools.genops(frame[5:])}
    assert "NEWOBJ" not in ops and "BUILD" not in ops
    [back] = read_frame(io.BytesIO(frame))
    assert back == original
    assert type(back) is EmitRequest and type(back.snapshot) is SpanSnapshot
    assert type(back.snapshot.groups[0]) is GroupSnapshot


def test_request_of_a_span_the_scheduler_never_saw_travels_as_is():
    unseen = EmitRequest(
        tags=("lazy",), ids=(ROOT_ID,), carried={}, snapshot=None, now=1.0,
        complete=True, close_reason="client", enter=0.5, exit=0.9,
    )
    assert restored_request(unseen, []) is unseen


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


class Tag(str):
    """A tag that is no plain ``str`` (marshal takes exact built-in types only)."""


def _sent(batch):
    """``batch`` as the sender encodes it, and what the export process reads."""
    frame = encode_batch(batch)
    return frame, read_frame(io.BytesIO(frame))


def test_a_batch_of_plain_values_is_marshalled_and_comes_back_as_the_same_objects():
    """The sender's batches go as marshal of their plain form (three quarters of pickle's
    cost on the scheduler): requests, snapshots and groups come back as the same
    named tuples, carried W3C headers as the same strings."""
    client_span = SpanContext(
        trace_id=0x1234, span_id=0x5678, is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
        trace_state=TraceState([("vendor", "v1")]),
    )
    child = snapshot(CHILD_ID, ("wf", "child"), offset=3)._replace(
        nthreads_history=MIRRORED_HISTORY
    )
    root = snapshot(ROOT_ID, ("wf",), offset=5, children=(child, "emitted-id"))._replace(
        nthreads_history=MIRRORED_HISTORY
    )
    original = EmitRequest(
        tags=("wf",), ids=(ROOT_ID,), carried={ROOT_ID: carrier_for(client_span)},
        snapshot=root, now=9.0, complete=True, close_reason="client", enter=1.0,
        exit=2.0, keep_summary=True, counted=True,
    )
    batch = [
        ("history", 0, tuple(HISTORY)),
        ("emits", [original]),
        ("metrics", [("span_opened", (("wf",),))]),
        ("flush", 7, 1.5),
    ]
    frame, back = _sent(batch)
    assert frame[4:5] == b"M"
    assert back == batch
    received = back[1][1][0]
    assert type(received) is EmitRequest and type(received.snapshot) is SpanSnapshot
    assert type(received.snapshot.groups[0]) is GroupSnapshot
    assert received.snapshot.children[0].nthreads_history is MIRRORED_HISTORY
    assert received.carried == {ROOT_ID: carrier_for(client_span)}


def test_a_request_in_its_plain_form_is_marshalled_as_it_is():
    """The plugin's requests are plain tuples (its snapshot too, a mirrored history
    as None): the sender marshals the very objects, its only change being the
    carried headers, made their strings in the request's own dict; the export
    process reads the named view back."""
    headers = {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01",
               "baggage": "not a W3C trace header"}
    named = request(snapshot(CHILD_ID, ("wf", "step"), offset=2)._replace(
        nthreads_history=MIRRORED_HISTORY
    ))._replace(ids=(ROOT_ID, CHILD_ID))
    plain_snapshot = tuple(named.snapshot)[:3] + (
        tuple(map(tuple, named.snapshot.groups)),
    ) + tuple(named.snapshot)[4:7] + (None, 2)
    carried = {ROOT_ID: {}, CHILD_ID: headers}
    plain = tuple(named)[:2] + (carried, plain_snapshot) + tuple(named)[4:]
    groups, metrics = plain_snapshot[3], plain_snapshot[4]
    frame, back = _sent([("emits", [plain])])
    assert frame[4:5] == b"M"
    assert plain[2] is carried and plain[3][3] is groups and plain[3][4] is metrics
    assert carried == {ROOT_ID: None, CHILD_ID: {"traceparent": headers["traceparent"]}}
    [received] = back[0][1]
    assert received == named._replace(carried=carried)
    assert type(received) is EmitRequest and type(received.snapshot) is SpanSnapshot
    assert received.snapshot.nthreads_history is MIRRORED_HISTORY


def test_a_plain_request_marshal_cannot_take_is_pickled_as_it_is_and_read_back_named():
    """Span code (distributed's ``SourceCode`` named tuples, with ``include-code``)
    in a plain request: the batch is pickled in its plain form, with the carried
    headers made strings as for marshal, and read back as the named view."""
    from distributed.client import SourceCode

    code = ((SourceCode("x = 1", 1, 1, "<cell>"),),)
    headers = {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01", "x": "y"}
    plain = (
        ("wf",), (ROOT_ID,), {ROOT_ID: headers},
        (ROOT_ID, ("wf",), 4.0, (("inc", 4.0, 8.5, 100, 0.5, 3, 0),), {}, (), code,
         None, 2),
        9.0, True, "client", None, None, False, True,
    )
    frame, back = _sent([("emits", [plain])])
    assert frame[4:5] == b"B"
    [received] = back[0][1]
    assert type(received) is EmitRequest and type(received.snapshot) is SpanSnapshot
    assert received.carried == {ROOT_ID: {"traceparent": headers["traceparent"]}}
    assert received.snapshot.code == code
    assert received.snapshot.groups == (GroupSnapshot("inc", 4.0, 8.5, 100, 0.5, 3, 0),)
    assert received.snapshot.nthreads_history is MIRRORED_HISTORY
    assert received.counted is True and received.keep_summary is False


def test_a_batch_with_a_value_marshal_cannot_take_is_pickled_and_comes_back_equal():
    """A ``str`` subclass (or any object) in a batch: the whole frame is pickled."""
    odd = request(snapshot(ROOT_ID, (Tag("wf"),), offset=2)._replace(
        nthreads_history=MIRRORED_HISTORY
    ))
    batch = [("emits", [odd]), ("metric", "span_opened", ((Tag("wf"),),))]
    frame, back = _sent(batch)
    assert frame[4:5] == b"B"
    assert back == batch
    assert type(back[0][1][0]) is EmitRequest


def test_a_frame_of_an_unknown_encoding_is_refused():
    stream = io.BytesIO(b"\0\0\0\2Xy")
    with pytest.raises(ValueError, match="unknown frame encoding"):
        read_frame(stream)

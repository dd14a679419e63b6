"""What crosses the pipe to the export process, without a process: frames of the
protocol's messages, and the tags of the spans heartbeat deltas name."""
from __future__ import annotations

import io

import pytest

from dask_otel_spans.protocol.wire import (
    encode_batch,
    read_frame,
    write_frame,
)

ROOT_ID = "6f1c1e9e-3b0a-4f57-9a49-2f6d1c3f0a11"
CHILD_ID = "0d9a8e77-51c4-4c6b-8c3e-7a5b2d1e9f22"


def test_frames_round_trip_and_end_with_eof():
    stream = io.BytesIO()
    write_frame(stream, [("span", 1)])
    write_frame(stream, {"b": 2})
    stream.seek(0)
    assert read_frame(stream) == [("span", 1)]
    assert read_frame(stream) == {"b": 2}
    with pytest.raises(EOFError):
        read_frame(stream)


def test_frame_cut_short_is_eof():
    stream = io.BytesIO()
    write_frame(stream, "x" * 100)
    stream = io.BytesIO(stream.getvalue()[:-10])
    with pytest.raises(EOFError):
        read_frame(stream)


class Tag(str):
    """A tag that is no plain ``str`` (marshal takes exact built-in types only)."""


def sent(batch: list) -> tuple[bytes, list]:
    """``batch`` as the sender encodes it, and what the export process reads."""
    frame = encode_batch(batch)
    return frame, read_frame(io.BytesIO(frame))


def test_a_batch_of_plain_messages_is_marshalled_and_comes_back_equal():
    chain = {ROOT_ID: {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}}
    batch = [
        ("span", (ROOT_ID,), ("wf",), 1.0, 0, 3),
        ("graph", 2.0, "client-1", [ROOT_ID], [chain], [],
         [(ROOT_ID, {"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01"})]),
        ("deltas", {("execute", ROOT_ID, "inc", "thread-cpu", "seconds"): 0.5}),
        ("flush", 7, 1.5),
    ]
    frame, back = sent(batch)
    assert frame[4:5] == b"M"
    assert back == batch


def test_a_batch_with_a_value_marshal_cannot_take_is_pickled_and_comes_back_equal():
    """A ``str`` subclass (or any object) in a batch: the whole frame is pickled."""
    batch = [("span", (ROOT_ID,), (Tag("wf"),), 1.0, 0, 3)]
    frame, back = sent(batch)
    assert frame[4:5] == b"B"
    assert back == batch and type(back[0][2][0]) is Tag


def test_a_frame_of_an_unknown_encoding_is_refused():
    stream = io.BytesIO(b"\0\0\0\2Xy")
    with pytest.raises(ValueError, match="unknown frame encoding"):
        read_frame(stream)

"""What crosses the pipe to the export process: length-prefixed frames (marshal of
plain built-ins for the sender's batches of messages, pickle for anything else), and
the control messages beside the protocol's events."""
from __future__ import annotations

import marshal
import pickle
import struct
from typing import IO, Any

_HEADER = struct.Struct("!I")
#: First byte of a frame's payload: how the rest is encoded (a batch of the sender's
#: messages is marshalled, or else pickled; any other object is pickled)
_PICKLED, _MARSHALLED, _PICKLED_BATCH = 0x50, 0x4D, 0x42  # "P", "M", "B"
_MARSHAL_VERSION = 4

# Control messages, beside the protocol's events (:mod:`.events`), as the first
# field of a frame's tuple. Scheduler -> export process:
#: ``(FLUSH, token, timeout)``: export what came before, flush, answer ``FLUSHED``
FLUSH = "flush"
# Export process -> scheduler:
#: ``(READY, info)``: the exporters are set up (where data goes, pid)
READY = "ready"
#: ``(FAILED, reason)``: the exporters could not be set up; the process ends
FAILED = "failed"
#: ``(STATS, figures)``: the session's figures, when they changed
STATS = "stats"
#: ``(FLUSHED, token, ok, figures)``: the answer to a ``FLUSH``
FLUSHED = "flushed"
#: ``(STOPPED, figures)``: the last figures, at the end of stdin
STOPPED = "stopped"


def encode_frame(obj: Any) -> bytes:
    """``obj`` pickled, with its length in front."""
    payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(payload) + 1) + bytes((_PICKLED,)) + payload


def encode_batch(batch: list[tuple[Any, ...]]) -> bytes:
    """A batch of messages as one frame: marshalled as they are (tuples of
    built-ins, as the forwarder makes them), or pickled when some value is not a
    plain built-in (a ``str`` subclass in a metric key, the ``SourceCode`` named
    tuples of ``include-code``...). Raises when the batch cannot be pickled either.
    """
    try:
        payload = marshal.dumps(batch, _MARSHAL_VERSION)
        kind = _MARSHALLED
    except Exception:  # (ValueError: a value marshal cannot take)
        payload = pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL)
        kind = _PICKLED_BATCH
    return _HEADER.pack(len(payload) + 1) + bytes((kind,)) + payload


def write_frame(stream: IO[bytes], obj: Any) -> None:
    """Pickle ``obj`` onto ``stream`` as one frame and flush it."""
    stream.write(encode_frame(obj))
    stream.flush()


def read_frame(stream: IO[bytes]) -> Any:
    """The next frame's object; raises ``EOFError`` when the stream ended."""
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError("export pipe closed")
    (size,) = _HEADER.unpack(header)
    payload = stream.read(size)
    if len(payload) < size:
        raise EOFError("export pipe closed in the middle of a frame")
    return decode_payload(payload)


def decode_payload(payload: bytes) -> Any:
    """The object of a frame's payload (after its length)."""
    if not payload:
        raise ValueError("empty frame")
    kind = payload[0]
    if kind == _PICKLED or kind == _PICKLED_BATCH:
        return pickle.loads(memoryview(payload)[1:])
    if kind == _MARSHALLED:
        return marshal.loads(memoryview(payload)[1:])
    raise ValueError(f"unknown frame encoding {kind:#x}")

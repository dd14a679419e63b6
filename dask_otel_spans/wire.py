"""What crosses the pipe to the export process: length-prefixed frames (marshal of
plain built-ins for the sender's batches, pickle for anything else), and the forms
the plugin's items take there (no references into the scheduler's live state, and
cheap to encode on the scheduler's side)."""
from __future__ import annotations

import copyreg
import io
import marshal
import pickle
import struct
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import IO, Any

from dask_otel_spans.emitter import EmitRequest, restore_request
from dask_otel_spans.propagation import w3c_headers
from dask_otel_spans.snapshot import MIRRORED_HISTORY, GroupSnapshot, SpanSnapshot

__all__ = [
    "MIRRORED_HISTORY",
    "decode_payload",
    "encode_batch",
    "encode_frame",
    "mirror_history",
    "read_frame",
    "restored_request",
    "span_tags_of",
    "write_frame",
]

_HEADER = struct.Struct("!I")
#: First byte of a frame's payload: how the rest is encoded (a batch of the sender's
#: messages is marshalled, or else pickled; any other object is pickled)
_PICKLED, _MARSHALLED, _PICKLED_BATCH = 0x50, 0x4D, 0x42  # "P", "M", "B"
_MARSHAL_VERSION = 4


def _reduce_named_tuple(obj: tuple[Any, ...]) -> tuple[Any, ...]:
    """A request, a snapshot or a task group's figures as a plain tuple and the
    class to call with it: a named tuple's own reduction goes through
    Python-level ``__getnewargs__`` and costs several times more."""
    return type(obj), tuple(obj)


#: How frames pickle what has no cheap reduction of its own (a private table: the
#: process's copyreg table is left as it is)
_DISPATCH_TABLE = {
    **copyreg.dispatch_table,
    EmitRequest: _reduce_named_tuple,
    SpanSnapshot: _reduce_named_tuple,
    GroupSnapshot: _reduce_named_tuple,
}


def encode_frame(obj: Any) -> bytes:
    """``obj`` pickled, with its length in front."""
    buffer = io.BytesIO()
    buffer.write(b"\0" * _HEADER.size)
    buffer.write(bytes((_PICKLED,)))
    pickler = pickle.Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL)
    pickler.dispatch_table = _DISPATCH_TABLE
    pickler.dump(obj)
    frame = buffer.getbuffer()
    _HEADER.pack_into(frame, 0, len(frame) - _HEADER.size)
    return bytes(frame)


def encode_batch(batch: list[tuple[Any, ...]]) -> bytes:
    """A batch of the sender's messages as one frame: marshalled as they are (the
    plugin's requests come in their plain form: tuples of built-ins; the carried
    W3C headers of each are made dicts of their strings, in place), or pickled when
    some value is not a plain built-in (a ``str`` subclass in a metric key, the
    ``SourceCode`` named tuples of ``include-code``...). :func:`read_frame` gives back each request's
    named view (:class:`~dask_otel_spans.emitter.EmitRequest`), with only the
    ``traceparent`` and ``tracestate`` strings of each carried header (None for a
    carrier without a valid one), either way.
    """
    plain = [_with_requests(message, _plain_request) for message in batch]
    try:
        payload = marshal.dumps(plain, _MARSHAL_VERSION)
        kind = _MARSHALLED
    except Exception:  # (ValueError: a value marshal cannot take)
        buffer = io.BytesIO()
        pickler = pickle.Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL)
        pickler.dispatch_table = _DISPATCH_TABLE
        pickler.dump(plain)
        payload = buffer.getvalue()
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
    if kind == _PICKLED:
        return pickle.loads(memoryview(payload)[1:])
    if kind == _MARSHALLED:
        batch = marshal.loads(memoryview(payload)[1:])
    elif kind == _PICKLED_BATCH:
        batch = pickle.loads(memoryview(payload)[1:])
    else:
        raise ValueError(f"unknown frame encoding {kind:#x}")
    return [_with_requests(message, restore_request) for message in batch]


# -- the plain form of the sender's messages (for marshal) ----------------------------

def _plain_snapshot(snap: SpanSnapshot | tuple[Any, ...] | str) -> tuple[Any, ...] | str:
    """The plain form of a snapshot given as its named view (or, for its copied
    children, in either form)."""
    if type(snap) is str:  # (a child whose summary the other side holds)
        return snap
    span_id, name, enqueued, groups, metrics, children, code, history, offset = snap
    if history is MIRRORED_HISTORY:
        history = None
    elif history is not None:
        history = tuple(history)
    return (
        span_id, name, enqueued, tuple(map(tuple, groups)), metrics,
        tuple(map(_plain_snapshot, children)) if children else (), code, history,
        offset,
    )


def _plain_carried(
    ids: Sequence[str], carried: Mapping[Any, Any]
) -> dict[str, dict[str, str] | None]:
    """The W3C headers a request carries that its translation reads (the root's and
    the span's own: :func:`~dask_otel_spans.propagation.resolve_chain`), as they may
    cross: only the headers' strings, whatever a client sent."""
    out = {}
    for dask_id in (ids[0], ids[-1]) if ids else ():
        carrier = carried.get(dask_id, _ABSENT)
        if carrier is not _ABSENT:
            out[dask_id] = w3c_headers(carrier)
    return out


#: Marks an id that a request carries nothing for
_ABSENT = object()


def _plain_request(request: tuple[Any, ...]) -> tuple[Any, ...]:
    """A request as it may cross. One in its plain form, as the plugin makes it, is
    passed on as it is, once its carried headers (the root's and its own, in a dict
    of its own) are made their strings, in place; a named view is made plain."""
    if type(request) is tuple:
        carried = request[2]
        if type(carried) is dict:
            for dask_id, carrier in carried.items():
                # (never fails: whatever a client carried crosses as None at worst)
                carried[dask_id] = w3c_headers(carrier)
            return request
        return request[:2] + (_plain_carried(request[1], carried or {}),) + request[3:]
    tags, ids, carried, snap = request[:4]
    return (
        tags, ids, _plain_carried(ids, carried) if carried else {},
        None if snap is None else _plain_snapshot(snap),
    ) + tuple(request[4:])


def _with_requests(
    message: tuple[Any, ...], convert: Callable[[Any], Any]
) -> tuple[Any, ...]:
    """``message`` with ``convert`` applied to its requests (those of "emit" and
    "emits"; other messages are plain built-ins already)."""
    kind = message[0]
    if kind == "emits":
        return ("emits", list(map(convert, message[1])))
    if kind == "emit":
        return ("emit", convert(message[1]))
    return message


def mirror_history(
    mirror: list[tuple[float, int]], start: int, entries: Sequence[tuple[float, int]]
) -> None:
    """Apply a "history" message to the export process's copy of the scheduler's
    ``total_nthreads_history``: its entries from ``start`` on (a message sent again
    after a failed write changes nothing)."""
    del mirror[start:]
    mirror.extend(entries)


def restored_request(
    request: EmitRequest, history: Sequence[tuple[float, int]]
) -> EmitRequest:
    """A request as the export process received it, its snapshot reading the
    ``total_nthreads_history`` copy ``history``."""
    snapshot = request.snapshot
    if snapshot is None or snapshot.nthreads_history is not MIRRORED_HISTORY:
        return request
    return request._replace(snapshot=snapshot._replace(nthreads_history=history))


def span_tags_of(
    deltas: Mapping[Hashable, float], span_tags: Mapping[str, Sequence[str]]
) -> dict[str, tuple[str, ...]]:
    """The tags of the spans named in heartbeat deltas
    ``{(context, span_id, prefix, activity, unit): value}``, as a plain dict."""
    out: dict[str, tuple[str, ...]] = {}
    for key in deltas:
        if isinstance(key, tuple) and len(key) >= 4:
            span_id = key[1]
            if span_id not in out:
                try:
                    out[span_id] = tuple(span_tags[span_id])
                except (KeyError, TypeError):  # unknown: the metrics use the id
                    pass
    return out

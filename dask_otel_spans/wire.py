"""What crosses the pipe to the export process: length-prefixed pickle frames, and
self-contained copies of the items the plugin queues (no references into the
scheduler's live state)."""
from __future__ import annotations

import pickle
import struct
from collections.abc import Hashable, Mapping, Sequence
from typing import IO, Any

from dask_otel_spans.emitter import EmitRequest
from dask_otel_spans.snapshot import SpanSnapshot

_HEADER = struct.Struct("!I")


def encode_frame(obj: Any) -> bytes:
    """``obj`` pickled, with its length in front."""
    payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(payload)) + payload


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
    return pickle.loads(payload)


def portable_request(request: EmitRequest) -> EmitRequest:
    """``request`` with its snapshots' reference to the scheduler's (append-only,
    ever-growing) ``total_nthreads_history`` replaced by a copy of the part from the
    oldest snapshot's offset on: what is pickled follows the span, not history."""
    snapshot = request.snapshot
    if snapshot is None or isinstance(snapshot.nthreads_history, tuple):
        return request
    start = _lowest_offset(snapshot)
    history = tuple(snapshot.nthreads_history[start:])
    return _with(request, snapshot=_rebased(snapshot, history, start))


def _lowest_offset(snapshot: SpanSnapshot) -> int:
    lowest = snapshot.nthreads_offset
    for child in snapshot.children:
        if not isinstance(child, str):
            lowest = min(lowest, _lowest_offset(child))
    return lowest


def _with(obj: Any, **changes: Any) -> Any:
    """``dataclasses.replace`` for the frozen dataclasses of a request, without
    running ``__init__`` again (a few µs a span on the sender thread)."""
    new = object.__new__(type(obj))
    new.__dict__.update(obj.__dict__, **changes)
    return new


def _rebased(
    snapshot: SpanSnapshot, history: tuple[tuple[float, int], ...], start: int
) -> SpanSnapshot:
    return _with(
        snapshot,
        nthreads_history=history,
        nthreads_offset=snapshot.nthreads_offset - start,
        children=tuple(
            child if isinstance(child, str) else _rebased(child, history, start)
            for child in snapshot.children
        ),
    )


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

"""What crosses the pipe to the export process: length-prefixed pickle frames, and
the forms the plugin's items take there (no references into the scheduler's live
state, and cheap to pickle on the scheduler's side)."""
from __future__ import annotations

import copyreg
import functools
import io
import pickle
import struct
from collections.abc import Hashable, Mapping, Sequence
from typing import IO, Any

from opentelemetry.trace import SpanContext, TraceFlags, TraceState

from dask_otel_spans.emitter import EmitRequest
from dask_otel_spans.snapshot import GroupSnapshot, SpanSnapshot

_HEADER = struct.Struct("!I")

class _MirroredHistory(tuple):
    """An empty history that pickles as a reference to :data:`MIRRORED_HISTORY`
    (so that the export process tells it from any other empty history)."""

    __slots__ = ()

    def __reduce__(self) -> str:
        return "MIRRORED_HISTORY"


#: ``nthreads_history`` of the snapshots sent to the export process, instead of a
#: reference to the scheduler's (append-only, ever-growing) ``total_nthreads_history``:
#: the sender sends that list's new entries once, as a "history" message, and the
#: export process keeps a copy of it (see :func:`restored_request`)
MIRRORED_HISTORY: tuple[tuple[float, int], ...] = _MirroredHistory()

#: Span contexts made again in the export process, remembered (a chain's ancestors
#: come with every span below them)
_RESTORED_CACHE_SIZE = 4096


def _reduce_span_context(ctx: SpanContext) -> tuple[Any, ...]:
    """A carried span context as numbers and a string: pickling a SpanContext as it
    is takes several µs (Python-level reduction of it and of its TraceState)."""
    state = ctx.trace_state
    return _restored_context, (
        (ctx.trace_id, ctx.span_id, int(ctx.trace_flags),
         state.to_header() if state else ""),
    )


@functools.lru_cache(maxsize=_RESTORED_CACHE_SIZE)
def _restored_context(portable: tuple[int, int, int, str]) -> SpanContext:
    trace_id, span_id, flags, state = portable
    return SpanContext(
        trace_id=trace_id,
        span_id=span_id,
        is_remote=True,
        trace_flags=TraceFlags(flags),
        trace_state=TraceState.from_header([state]) if state else TraceState(),
    )


def _reduce_named_tuple(obj: tuple[Any, ...]) -> tuple[Any, ...]:
    """A request, a snapshot or a task group's figures as a plain tuple and the
    class to call with it: a named tuple's own reduction goes through
    Python-level ``__getnewargs__`` and costs several times more."""
    return type(obj), tuple(obj)


#: How frames pickle what has no cheap reduction of its own (a private table: the
#: process's copyreg table is left as it is)
_DISPATCH_TABLE = {
    **copyreg.dispatch_table,
    SpanContext: _reduce_span_context,
    EmitRequest: _reduce_named_tuple,
    SpanSnapshot: _reduce_named_tuple,
    GroupSnapshot: _reduce_named_tuple,
}


def encode_frame(obj: Any) -> bytes:
    """``obj`` pickled, with its length in front."""
    buffer = io.BytesIO()
    buffer.write(b"\0" * _HEADER.size)
    pickler = pickle.Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL)
    pickler.dispatch_table = _DISPATCH_TABLE
    pickler.dump(obj)
    frame = buffer.getbuffer()
    _HEADER.pack_into(frame, 0, len(frame) - _HEADER.size)
    return bytes(frame)


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

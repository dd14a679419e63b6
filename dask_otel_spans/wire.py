"""What crosses the pipe to the export process: length-prefixed pickle frames, and
self-contained copies of the items the plugin queues (no references into the
scheduler's live state, and cheap to pickle)."""
from __future__ import annotations

import functools
import pickle
import struct
from collections.abc import Hashable, Mapping, Sequence
from typing import IO, Any

from opentelemetry.trace import SpanContext, TraceFlags, TraceState

from dask_otel_spans.emitter import EmitRequest
from dask_otel_spans.snapshot import SpanSnapshot

#: A carried span context as it crosses the pipe: (trace id, span id, trace flags,
#: tracestate header). Pickling a SpanContext object takes several µs (Python-level
#: reduction of it and of its TraceState), a tuple of numbers and a string a fraction
#: of one; the export process makes SpanContexts of them again.
PortableContext = tuple[int, int, int, str]
#: Span contexts made again in the export process, remembered (a chain's ancestors
#: come with every span below them)
_RESTORED_CACHE_SIZE = 4096

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
    oldest snapshot's offset on (what is pickled follows the span, not history), and
    its carried span contexts as :data:`PortableContext` tuples
    (:func:`restored_request` undoes that)."""
    changes: dict[str, Any] = {}
    carried = request.carried
    for ctx in carried.values():
        if ctx is not None:
            changes["carried"] = {
                dask_id: _portable_context(ctx) for dask_id, ctx in carried.items()
            }
            break
    snapshot = request.snapshot
    if snapshot is not None and not isinstance(snapshot.nthreads_history, tuple):
        start = _lowest_offset(snapshot)
        history = tuple(snapshot.nthreads_history[start:])
        changes["snapshot"] = _rebased(snapshot, history, start)
    return _with(request, **changes) if changes else request


def restored_request(request: EmitRequest) -> EmitRequest:
    """A request as :func:`portable_request` made it, with SpanContext objects in
    ``carried`` again (in the export process)."""
    carried = request.carried
    for ctx in carried.values():
        if type(ctx) is tuple:
            return _with(request, carried={
                dask_id: _restored_context(ctx) if type(ctx) is tuple else ctx
                for dask_id, ctx in carried.items()
            })
    return request


def _portable_context(ctx: Any) -> PortableContext | Any:
    if not isinstance(ctx, SpanContext):
        return ctx  # None (or anything else, sent as it is)
    state = ctx.trace_state
    return (ctx.trace_id, ctx.span_id, int(ctx.trace_flags),
            state.to_header() if state else "")


@functools.lru_cache(maxsize=_RESTORED_CACHE_SIZE)
def _restored_context(portable: PortableContext) -> SpanContext:
    trace_id, span_id, flags, state = portable
    return SpanContext(
        trace_id=trace_id,
        span_id=span_id,
        is_remote=True,
        trace_flags=TraceFlags(flags),
        trace_state=TraceState.from_header([state]) if state else TraceState(),
    )


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

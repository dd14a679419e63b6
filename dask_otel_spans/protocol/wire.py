"""What crosses the pipe to the export process: length-prefixed frames (marshal of
plain built-ins for the sender's batches of messages, pickle for anything else), and
the control messages beside the protocol's events: a flush, in the stream of events
to the export process; the export process's answers, each a type of its own."""
from __future__ import annotations

import marshal
import pickle
import struct
from typing import IO, Any, NamedTuple, TypeAlias, TypeGuard

from dask_otel_spans.protocol.events import Message
from dask_otel_spans.protocol.figures import ExportFigures

_HEADER = struct.Struct("!I")
#: First byte of a frame's payload: how the rest is encoded (a batch of the sender's
#: messages is marshalled, or else pickled; any other object is pickled)
_PICKLED, _MARSHALLED, _PICKLED_BATCH = 0x50, 0x4D, 0x42  # "P", "M", "B"
_MARSHAL_VERSION = 4

# -- scheduler -> export process: in the stream of the protocol's events ---------------

#: The kind of a flush message (beside those of :mod:`.events`)
FLUSH = "flush"

#: A flush as it crosses (:func:`flush_message`): ``(FLUSH, token, timeout, exporters)``
FlushMessage: TypeAlias = tuple[str, int, float, bool]


class Flush(NamedTuple):
    """Apply what came before and hand over what is ready, flush the exporters too
    (``exporters``), and answer :class:`Flushed` (as it crosses: the plain tuple of
    :func:`flush_message`, in a batch of events)."""

    token: int
    timeout: float
    exporters: bool = True


def flush_message(token: int, timeout: float, exporters: bool = True) -> FlushMessage:
    """The flush as it crosses, among the events."""
    return (FLUSH, token, timeout, exporters)


def is_flush(message: tuple[object, ...]) -> TypeGuard[FlushMessage]:
    return bool(message[0] == FLUSH)


def read_flush(message: FlushMessage) -> Flush:
    """The fields of a flush message."""
    return Flush(*message[1:])


# -- export process -> scheduler: its answers (pickled frames) ---------------------------

#: Where the export session sends, as it says when ready: ``traces_to``,
#: ``metrics_to``, ``exceptions_to`` (in words), ``export_process`` and the export
#: process's ``pid``
Destinations: TypeAlias = "dict[str, str | int | bool]"


class Ready(NamedTuple):
    """The exporters are set up: where data goes, and the process's pid."""

    destinations: Destinations


class SetupFailed(NamedTuple):
    """The exporters could not be set up; the process ends."""

    reason: str


class Figures(NamedTuple):
    """The session's figures, when they changed (every half second at most)."""

    figures: ExportFigures


class Flushed(NamedTuple):
    """The answer to a :class:`Flush`: whether it finished, and the figures then."""

    token: int
    ok: bool
    figures: ExportFigures


class Stopped(NamedTuple):
    """The last figures, at the end of the process's stdin."""

    figures: ExportFigures


class HandedOver(NamedTuple):
    """The places in the scheduler's span dict of the spans the export process is
    about to hand over, as runs ``(first, last)``, said before it does: should it die,
    the next one is sent again the done spans it had not handed over, and none it had."""

    runs: tuple[tuple[int, int], ...]


#: What the export process says
Answer = Ready | SetupFailed | Figures | Flushed | Stopped | HandedOver


def encode_frame(obj: object) -> bytes:
    """``obj`` pickled, with its length in front."""
    payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(payload) + 1) + bytes((_PICKLED,)) + payload


def encode_batch(batch: list[Message]) -> bytes:
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


def write_frame(stream: IO[bytes], obj: object) -> None:
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

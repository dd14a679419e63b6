"""Pure translation of the task records a dask span kept (``task-spans``) into OTel
task span fields: times, attributes, action events, and an erred task's status and
``exception`` event, as OpenTelemetry's exception conventions name them."""
from __future__ import annotations

import ast
import builtins
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dask_otel_spans import names
from dask_otel_spans.protocol.exceptions import exception_type
from dask_otel_spans.protocol.propagation import task_span_id

if TYPE_CHECKING:
    from opentelemetry.util.types import AttributeValue

    from dask_otel_spans.protocol.tasks import TaskRecord

#: ``repr(exception)`` as dask's ``error_message`` sends it: ``Type(args)``
_REPR = re.compile(r"([A-Za-z_][\w.]*)\((.*)\)", re.DOTALL)


def _ns(seconds: float) -> int:
    return int(round(seconds * 1e9))


@dataclass(slots=True)
class TaskEvent:
    """A span event: name, time (ns), attributes."""

    name: str
    time_ns: int
    attributes: Mapping[str, AttributeValue]


@dataclass(slots=True)
class TaskSpanFields:
    """Fields of the OTel span of one task."""

    name: str
    span_id: int
    start_ns: int
    end_ns: int
    attributes: dict[str, AttributeValue]
    events: list[TaskEvent]
    #: the exception type, for an erred task (status ERROR, as its description)
    error: str | None


def exception_message(kind: str, args: tuple[object, ...]) -> str:
    """``str(e)`` of an exception of the type named ``kind`` made with ``args``.

    A built-in type is made again from ``args`` (literals only) and asked, so that
    the types whose ``str`` is not their argument's say what they say:
    ``KeyError('k')`` gives ``'k'`` (quoted), ``FileNotFoundError(2, 'No such file')``
    ``[Errno 2] No such file``. Another type is taken to keep
    ``BaseException.__str__``: its one argument as ``str``, the tuple of several,
    nothing without (its own ``__str__``, if it has one, is not known here).
    """
    cls = getattr(builtins, kind, None)
    if isinstance(cls, type) and issubclass(cls, BaseException):
        try:
            return str(cls(*args))
        except Exception:
            pass  # (arguments the type does not take: as BaseException says)
    if len(args) == 1:
        return str(args[0])
    return str(args) if args else ""


def exception_parts(text: str) -> tuple[str, str]:
    """``(type, message)`` of an exception from its ``repr``, as ``type(e).__name__``
    and ``str(e)`` would give them: ``ValueError('boom')`` gives
    ``("ValueError", "boom")``, ``KeyError('k')`` ``("KeyError", "'k'")`` (see
    :func:`exception_message`). A ``repr`` of another shape gives
    ``("Exception", text)``.

    The scheduler hears of an erred task its exception pickled (not unpickled
    there: the class may not even be importable) and as ``exception_text``, which
    is ``repr(e)`` (``distributed.core.error_message``): no ``str(e)`` comes with
    it, so it is worked out from the ``repr``.
    """
    match = _REPR.fullmatch(text.strip())
    if match is None:
        return "Exception", text
    kind, inner = match.groups()
    try:
        args = ast.literal_eval(f"({inner},)") if inner.strip() else ()
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        return kind, inner
    return kind, exception_message(kind, args)


def exception_attributes(record: TaskRecord, with_details: bool) -> dict[str, str]:
    """The ``exception`` event's attributes: the type, and unless ``with_details``
    is off (``record-exceptions: false``) the message and a stack trace in Python's
    format (the worker's frames, then the exception line)."""
    kind, message = exception_parts(record.exception or "")
    kind = exception_type(kind, record.exception_class)
    attributes: dict[str, str] = {names.EXCEPTION_TYPE: kind}
    if with_details:
        attributes[names.EXCEPTION_MESSAGE] = message
        # (Python's last line: the type alone when the message is empty; Python
        # writes the qualified name there too)
        last = f"{kind}: {message}" if message else kind
        attributes[names.EXCEPTION_STACKTRACE] = (
            f"Traceback (most recent call last):\n{record.traceback or ''}{last}"
        )
    return attributes


def task_span_fields(
    dask_id: str,
    prefix: str,
    records: Iterable[TaskRecord],
    *,
    default_start: float,
    default_stop: float,
    record_exceptions: bool = True,
) -> list[TaskSpanFields]:
    """The task spans of one prefix of a dask span. A task the worker reported no
    compute for (it erred before running) takes ``default_start`` and
    ``default_stop`` (its prefix span's times)."""
    out = []
    for record in records:
        start, stop = record.start, record.stop
        if not start or not stop:
            start, stop = default_start, default_stop
        attributes: dict[str, AttributeValue] = {
            names.TASK_PREFIX: prefix,
            names.TASK_KEY: record.key,
            names.WORKER_ADDRESS: record.worker,
        }
        if record.nbytes >= 0:
            attributes[names.TASK_NBYTES] = record.nbytes
        if record.function:
            attributes[names.CODE_FUNCTION_NAME] = record.function
        events = [
            TaskEvent(action, _ns(a), {names.TASK_ACTION_DURATION: max(0.0, b - a)})
            for action, a, b in record.actions
        ]
        error = None
        if record.erred:
            exc = exception_attributes(record, record_exceptions)
            error = exc[names.EXCEPTION_TYPE]
            attributes[names.ERROR_TYPE] = error
            events.append(TaskEvent(names.EXCEPTION_EVENT, _ns(stop), exc))
        out.append(TaskSpanFields(
            name=prefix,
            span_id=task_span_id(dask_id, record.key),
            start_ns=_ns(start),
            end_ns=_ns(max(start, stop)),
            attributes=attributes,
            events=events,
            error=error,
        ))
    return out

"""Tasks as the scheduler reports them to the export side: the ``task-spans``
modes, the cuts, and one task's record (:class:`TaskRecord`)."""
from __future__ import annotations

from typing import NamedTuple

#: ``task-spans`` values: spans for the erred tasks; the erred and the slowest; every
#: task; none
ERRED, SLOWEST, ALL, NONE = "erred", "slowest", "all", "none"


TASK_SPAN_MODES = (ERRED, SLOWEST, ALL, NONE)


#: Longest ``exception.message`` and ``exception.stacktrace`` kept (characters);
#: the scheduler cuts them, so a task span holds at most this much
MAX_EXCEPTION_MESSAGE_LENGTH = 4096


MAX_STACKTRACE_LENGTH = 16384


#: Longest ``dask.task.key`` kept (characters) before the attribute length limit
MAX_KEY_LENGTH = 1024


class TaskRecord(NamedTuple):
    """One task's fate, as the scheduler heard it (plain built-ins: it crosses to the
    export process as they are). Times are on the scheduler's clock."""

    key: str
    worker: str
    #: the compute action's start and stop; 0 when the worker reported none
    start: float
    stop: float
    #: -1 for a task that erred
    nbytes: int
    #: the other actions: ``((action, start, stop), ...)``
    actions: tuple[tuple[str, float, float], ...]
    #: ``repr`` of the exception and the traceback's text (``None`` unless erred)
    exception: str | None
    traceback: str | None
    #: what names the exception's class
    #: (:func:`~dask_otel_spans.protocol.exceptions.exception_class`)
    exception_class: str | bytes | None = None
    #: the task's function as dask names it, when the task is a plain function call
    function: str | None = None

    @property
    def erred(self) -> bool:
        return self.exception is not None

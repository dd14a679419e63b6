"""Log correlation on a worker: every log record carries the trace context current
where it was made (``otelTraceID``, ``otelSpanID``, ``otelTraceSampled``,
``otelServiceName``: the attribute names and formats of
opentelemetry-instrumentation-logging, so that any format string can print them),
and, with a logger provider, records made in tasks are exported as OTel logs."""
from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING

from opentelemetry import trace

if TYPE_CHECKING:
    from opentelemetry.sdk._logs import LoggerProvider

#: Set while a task runs (by the worker plugin, in the task's context): which log
#: records are exported as OTel logs
IN_TASK: ContextVar[bool] = ContextVar("dask_otel_spans_in_task", default=False)
#: ``OTEL_PYTHON_LOG_LEVEL`` values
LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING,
              "warning": logging.WARNING, "error": logging.ERROR}
#: The level of exported log records when ``OTEL_PYTHON_LOG_LEVEL`` is unset
DEFAULT_EXPORT_LEVEL = logging.WARNING


def export_level(environ: Mapping[str, str] | None = None) -> int:
    """The level from which records made in tasks are exported
    (``OTEL_PYTHON_LOG_LEVEL``, default WARNING)."""
    environ = os.environ if environ is None else environ
    value = str(environ.get("OTEL_PYTHON_LOG_LEVEL") or "").strip().lower()
    return LOG_LEVELS.get(value, DEFAULT_EXPORT_LEVEL)


class TraceContextRecords:
    """A log record factory adding the current trace context to each record, over
    the factory that was installed before it (restored by :meth:`uninstall`).

    Parameters
    ----------
    service_name:
        ``otelServiceName`` of every record
    """

    def __init__(self, service_name: str):
        self.service_name = service_name
        self._previous: Callable[..., logging.LogRecord] = logging.LogRecord
        self._active = False

    def install(self) -> None:
        self._previous = logging.getLogRecordFactory()
        self._active = True
        logging.setLogRecordFactory(self._make)

    def uninstall(self) -> None:
        """Put the previous factory back (when another one was installed over this
        one since, this one stays in the chain and only stops adding the fields)."""
        self._active = False
        if logging.getLogRecordFactory() == self._make:
            logging.setLogRecordFactory(self._previous)

    def _make(self, *args: object, **kwargs: object) -> logging.LogRecord:
        record = self._previous(*args, **kwargs)
        if not self._active:
            return record
        ctx = trace.get_current_span().get_span_context()
        if ctx.is_valid:
            record.otelSpanID = format(ctx.span_id, "016x")
            record.otelTraceID = format(ctx.trace_id, "032x")
            record.otelTraceSampled = ctx.trace_flags.sampled
        else:
            record.otelSpanID = "0"
            record.otelTraceID = "0"
            record.otelTraceSampled = False
        record.otelServiceName = self.service_name
        return record


class SharedRecords:
    """One :class:`TraceContextRecords` per process, however many workers of it
    (in-process clusters) use it: installed by the first, put back by the last."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: TraceContextRecords | None = None
        self._users = 0

    def acquire(self, service_name: str) -> None:
        with self._lock:
            if self._records is None:
                self._records = TraceContextRecords(service_name)
                self._records.install()
            self._users += 1

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users <= 0 and self._records is not None:
                self._records.uninstall()
                self._records, self._users = None, 0


#: The process's record factory, shared by the worker plugins of the process
PROCESS_RECORDS = SharedRecords()


class TaskRecordsOnly(logging.Filter):
    """Pass the records made while a task runs."""

    def filter(self, record: logging.LogRecord) -> bool:
        return IN_TASK.get()


class LastResort(logging.Handler):
    """Python's last resort (``logging.lastResort``: WARNING and above to stderr)
    for the records no handler but the package's would take.

    A handler on the root logger turns the last resort off for every record that
    reaches it: without this one, adding the task log handler would silence the
    warnings a worker's tasks and libraries print to its stderr.
    """

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        setattr(self, _OURS, True)

    def handle(self, record: logging.LogRecord) -> bool:
        resort = logging.lastResort
        if (resort is None or record.levelno < resort.level
                or getattr(record, _PRINTED, False) or not _alone(record)):
            return False
        # (several workers in one process: the first last resort prints it)
        setattr(record, _PRINTED, True)
        resort.handle(record)
        return True

    def emit(self, record: logging.LogRecord) -> None:  # (handle does the work)
        pass



#: Marks the package's handlers (:class:`LastResort` looks past them)
_OURS = "_dask_otel_spans_handler"
#: Marks a record a :class:`LastResort` printed
_PRINTED = "_dask_otel_spans_last_resort"


def _alone(record: logging.LogRecord) -> bool:
    """Whether the package's handlers are the only ones on the record's way up the
    loggers (as ``Logger.callHandlers`` walks it)."""
    node: logging.Logger | None = logging.getLogger(record.name)
    while node is not None:
        for handler in node.handlers:
            if not getattr(handler, _OURS, False):
                return False
        if not node.propagate:
            break
        node = node.parent
    return True


def task_log_handlers(logger_provider: LoggerProvider, level: int
                      ) -> list[logging.Handler]:
    """The handlers to put on the root logger: the OTel SDK's logging handler over
    ``logger_provider``, for the records made in tasks at ``level`` and above (the
    SDK takes their trace context from the current context), and a
    :class:`LastResort`, so that stderr shows what it showed without them."""
    from opentelemetry.sdk._logs import LoggingHandler

    handler = LoggingHandler(level=level, logger_provider=logger_provider)
    handler.addFilter(TaskRecordsOnly())
    setattr(handler, _OURS, True)
    return [handler, LastResort()]

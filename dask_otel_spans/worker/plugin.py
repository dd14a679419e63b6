"""``OTelWorkerPlugin``: task code runs inside its dask span's trace on a worker.

While a task runs (thread pool executors, and ``async def`` tasks on the worker's
event loop), the current OTel context holds the span context of its prefix span
inside the dask span the scheduler put it in, exactly as the scheduler exports it
(:mod:`~dask_otel_spans.worker.context`), so that spans made in the task, by its code
or by an instrumentation library, join that trace. Log records carry the trace
context (:mod:`~dask_otel_spans.worker.logs`), and with ``OTEL_LOGS_EXPORTER``
those made in tasks are exported as OTel logs. The process's providers come from
:mod:`~dask_otel_spans.worker.providers`.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Mapping
from typing import TYPE_CHECKING, Protocol, TypedDict

import dask
from distributed.diagnostics.plugin import WorkerPlugin
from opentelemetry import context as otel_context

from dask_otel_spans import names
from dask_otel_spans.config import setting
from dask_otel_spans.sdk.providers import flush_provider
from dask_otel_spans.worker.context import TaskContexts, carried_by_submissions
from dask_otel_spans.worker.logs import (
    IN_TASK,
    PROCESS_RECORDS,
    export_level,
    task_log_handlers,
)
from dask_otel_spans.worker.providers import WorkerProviders, worker_providers

if TYPE_CHECKING:
    from dask.typing import Key
    from distributed import Worker
    from distributed.worker_state_machine import StateMachineEvent, TaskState

    from dask_otel_spans.worker.providers import Provider

logger = logging.getLogger(__name__)

#: Longest wait at teardown for the providers this plugin installed to flush
FLUSH_TIMEOUT = 3.0


class _Execute(Protocol):
    """``Worker.execute``, bound."""

    def __call__(self, key: Key, *, stimulus_id: str) -> Awaitable[StateMachineEvent]: ...


class _State(TypedDict):
    """What a pickled plugin holds: its parameters."""

    prefix_spans: bool | None
    environ: dict[str, str] | None
    output_dir: str | None


class OTelWorkerPlugin(WorkerPlugin):
    """Run task code inside the OTel context of its dask span.

    Parameters
    ----------
    prefix_spans:
        Whether tasks run under their prefix span (the scheduler's
        ``otel-spans.prefix-spans``) or under the dask span's own span; default:
        the worker's ``otel-spans.prefix-spans``
    environ:
        Mapping to read ``OTEL_*`` variables from; default ``os.environ``
    output_dir:
        The embedded default's directory (each worker process writes below it, in
        a directory of its own); default: the worker's ``otel-spans.output-dir``

    Examples
    --------
    >>> client.register_plugin(OTelWorkerPlugin())  # doctest: +SKIP

    or ``dask worker --preload dask_otel_spans``.
    """

    name = names.WORKER_PLUGIN_NAME
    idempotent = True

    def __init__(self, prefix_spans: bool | None = None,
                 environ: Mapping[str, str] | None = None,
                 output_dir: str | None = None):
        self.prefix_spans = prefix_spans
        self.environ = dict(environ) if environ is not None else None
        self.output_dir = output_dir
        self.providers = WorkerProviders()
        self.contexts: TaskContexts | None = None
        #: the worker's task states, and its own ``execute`` (bound, unwrapped)
        self._tasks: Mapping[Key, TaskState] = {}
        # (set by ``setup``, before the worker calls ``_execute``)
        self._run: _Execute = None  # type: ignore[assignment]
        self._records_held = False
        #: the handlers put on the root logger (the task log handler, the last resort)
        self._handlers: list[logging.Handler] = []

    def __getstate__(self) -> _State:
        return {"prefix_spans": self.prefix_spans, "environ": self.environ,
                "output_dir": self.output_dir}

    def __setstate__(self, state: _State) -> None:
        self.__init__(**state)  # type: ignore[misc]

    def setup(self, worker: Worker, **kwargs: object) -> None:
        prefix_spans = self.prefix_spans
        if prefix_spans is None:
            # (read as the scheduler reads it: DASK_OTEL_SPANS__PREFIX_SPANS=false is
            # False; a bad value is one ERROR line and the default)
            prefix_spans = setting("prefix-spans")
        output_dir = self.output_dir or setting("output-dir")
        try:
            # (a signal that cannot be built is one ERROR line there; the others
            # are built all the same)
            self.providers = worker_providers(
                worker.address, worker.name, environ=self.environ, output_dir=output_dir
            )
        except Exception as e:  # (not a configuration: a bug, or the SDK's)
            logger.error("dask_otel_spans: cannot build this worker's OTel providers "
                         "(%s: %s); tasks still run in their span's context, and spans "
                         "they make go to the global providers, if any",
                         type(e).__name__, e)
        self.contexts = TaskContexts(prefix_spans)
        PROCESS_RECORDS.acquire(self._service_name())
        self._records_held = True
        if self.providers.logger_provider is not None and (
            self.providers.logger_provider in self.providers.built
        ):
            self._handlers = task_log_handlers(
                self.providers.logger_provider, export_level(self.environ)
            )
            for handler in self._handlers:
                logging.getLogger().addHandler(handler)
        self._tasks = worker.state.tasks
        self._run = worker.execute
        worker.execute = self._execute  # type: ignore[method-assign]
        logger.info(
            "dask_otel_spans: tasks run in their dask span's trace; spans made in "
            "tasks go to %s; metrics to %s; logs made in tasks to %s",
            self.providers.traces_to, self.providers.metrics_to, self.providers.logs_to,
        )

    async def teardown(self, worker: Worker, **kwargs: object) -> None:
        if worker.__dict__.get("execute") == self._execute:
            del worker.execute
        if self._records_held:
            PROCESS_RECORDS.release()
            self._records_held = False
        for handler in self._handlers:
            logging.getLogger().removeHandler(handler)
        self._handlers = []
        installed = list(self.providers.built)
        if installed:
            # (the SDK shuts them down at exit; the global providers cannot be
            # taken back from task code that holds them)
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, flush_providers, installed, FLUSH_TIMEOUT)

    def _service_name(self) -> str:
        provider = self.providers.tracer_provider
        resource = getattr(provider, "resource", None)
        attributes = getattr(resource, "attributes", None) or {}
        return str(attributes.get(names.SERVICE_NAME, ""))

    async def _execute(self, key: Key, *, stimulus_id: str) -> StateMachineEvent:
        """``Worker.execute`` inside the task's OTel context: this runs in the asyncio
        task of the one execution, whose context the executor's thread copies."""
        execute = self._run
        ts = self._tasks.get(key)
        ctx = carried = None
        if ts is not None and self.contexts is not None:
            ctx = self.contexts.context_of(ts.span_id, ts.prefix, ts.annotations)
            # what graphs that task code submits carry (worker_client, get_client):
            # its tree's contexts, so that their spans and tasks join the root's trace
            carried = carried_by_submissions(ts.annotations)
        if ctx is None:
            return await execute(key, stimulus_id=stimulus_id)
        token = otel_context.attach(ctx)
        in_task = IN_TASK.set(True)
        try:
            if carried is None:
                return await execute(key, stimulus_id=stimulus_id)
            with dask.annotate(**carried):
                return await execute(key, stimulus_id=stimulus_id)
        finally:
            IN_TASK.reset(in_task)
            otel_context.detach(token)


def flush_providers(providers: list[Provider], timeout: float) -> None:
    """Flush ``providers``, a meter provider's push readers only (a pull reader,
    such as Prometheus's, is never flushed:
    :func:`~dask_otel_spans.sdk.providers.flush_provider`)."""
    for provider in providers:
        try:
            flush_provider(provider, int(timeout * 1000))
        except Exception:
            logger.warning("dask_otel_spans: flushing %s failed",
                           type(provider).__name__, exc_info=True)

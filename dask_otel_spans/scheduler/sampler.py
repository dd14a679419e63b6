"""Which tasks get a task span (setting ``task-spans``), bounded by ``max-task-spans``
per task prefix per dask span: on the event loop, a :class:`TaskSampler` keeps the
chosen tasks of each task group from the ``transition`` hook's arguments; in the
export session, a :class:`PrefixTasks` merges the groups of one prefix of one span
under the same cap.
"""
from __future__ import annotations

import heapq
import itertools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeAlias

from dask.utils import funcname

from dask_otel_spans.protocol.dask_private import task_function
from dask_otel_spans.protocol.exceptions import exception_class
from dask_otel_spans.protocol.tasks import (
    ALL,
    MAX_EXCEPTION_MESSAGE_LENGTH,
    MAX_KEY_LENGTH,
    MAX_STACKTRACE_LENGTH,
    NONE,
    SLOWEST,
    TaskRecord,
)

if TYPE_CHECKING:
    from dask.typing import Key
    from distributed.scheduler import TaskGroup

#: The ``transition`` hook's keyword arguments (``worker``, ``startstops``, ``nbytes``,
#: ``exception``, ``exception_text``, ``traceback_text``...): distributed passes them
#: untyped (``SchedulerPlugin.transition``'s ``**kwargs``), and they are read here
#: as they come, their shape checked by the reads
TransitionKwargs: TypeAlias = Mapping[str, Any]
#: What names an erred task's exception class
#: (:func:`~dask_otel_spans.protocol.exceptions.exception_class`), and its type name
ErredClass: TypeAlias = tuple[str | bytes | None, str]

#: Longest ``code.function.name`` kept (characters)
MAX_FUNCTION_LENGTH = 256
#: Distinct exception classes counted per task group between two ticks; the rest are
#: counted as of no known class
MAX_ERROR_CLASSES = 8


def function_name(run_spec: object) -> str | None:
    """The task's function as dask names it (``dask.utils.funcname``) when its run
    spec is a plain function call (a dask ``Task`` of a callable, or a task tuple
    ``(func, *args)`` on releases before it:
    :func:`~dask_otel_spans.protocol.dask_private.task_function`); None otherwise."""
    func = task_function(run_spec)
    if func is None:
        return None
    try:
        return str(funcname(func))[:MAX_FUNCTION_LENGTH] or None
    except Exception:
        return None


def exception_name(exception_text: object) -> str:
    """The exception type's name as its ``repr`` (``exception_text``) starts."""
    text = str(exception_text or "")[:MAX_FUNCTION_LENGTH]
    return text.partition("(")[0].strip()


def task_record(key: Key, kwargs: TransitionKwargs, erred: bool,
                run_spec: object = None) -> TaskRecord:
    """The record of a task that finished (``processing -> memory``) or erred
    (``processing -> erred``), from the ``transition`` hook's keyword arguments
    (and the task's run spec, for its function's name)."""
    start = stop = 0.0
    actions = []
    for ss in kwargs.get("startstops") or ():
        try:
            action, a, b = str(ss["action"]), float(ss["start"]), float(ss["stop"])
        except (KeyError, TypeError, ValueError):
            continue
        if action == "compute":
            start, stop = a, b
        else:
            actions.append((action, a, b))
    exception = traceback = None
    if erred:
        exception = str(kwargs.get("exception_text") or "Exception()")
        exception = exception[:MAX_EXCEPTION_MESSAGE_LENGTH]
        traceback = str(kwargs.get("traceback_text") or "")[:MAX_STACKTRACE_LENGTH]
    nbytes = kwargs.get("nbytes")
    return TaskRecord(
        str(key)[:MAX_KEY_LENGTH], str(kwargs.get("worker") or ""), start, stop,
        int(nbytes) if isinstance(nbytes, int) and not erred else -1,
        tuple(actions), exception, traceback,
        exception_class(kwargs.get("exception")) if erred else None,
        function_name(run_spec),
    )


def compute_times(kwargs: TransitionKwargs) -> tuple[float, float]:
    """The task's compute action's ``(start, stop)``; ``(0.0, 0.0)`` when the worker
    reported none."""
    for ss in kwargs.get("startstops") or ():
        try:
            if ss["action"] == "compute":
                return float(ss["start"]), float(ss["stop"])
        except (KeyError, TypeError, ValueError):
            return 0.0, 0.0
    return 0.0, 0.0


def compute_seconds(kwargs: TransitionKwargs) -> float:
    """How long the task's compute action took (0 when not reported)."""
    start, stop = compute_times(kwargs)
    return stop - start


class GroupTasks:
    """The tasks of one task group chosen so far, and how many could have been."""

    __slots__ = ("erred", "others", "erred_seen", "others_seen")

    def __init__(self) -> None:
        self.erred: list[TaskRecord] = []
        #: ``(sort key, tie-break, record)``: a min-heap under ``slowest``
        self.others: list[tuple[float, int, TaskRecord]] = []
        self.erred_seen = 0
        self.others_seen = 0

    def message_fields(self) -> tuple[list[tuple[object, ...]], int, int]:
        """``(records, erred_seen, others_seen)`` as the ``tasks`` message has them."""
        records: list[tuple[object, ...]] = [tuple(r) for r in self.erred]
        records.extend(tuple(r) for _, _, r in self.others)
        return records, self.erred_seen, self.others_seen


class TaskSampler:
    """Keep, per task group, the tasks whose spans ``mode`` asks for, at most ``cap``
    of each kind; the forwarder takes a group's tasks when it forwards the group.

    The hooks call :meth:`erred` for each task that erred and, under ``slowest``
    and ``all`` only, :attr:`finished` for each that finished (None otherwise, so
    that a graph without errors costs nothing more under ``erred``).

    Whatever ``mode`` and ``cap`` say, :meth:`erred` also widens the group's
    :attr:`erred_windows` (two floats per group): dask's ``TaskGroup`` takes its
    ``start`` and ``stop`` from the tasks that finished only, so the times of a
    prefix whose tasks erred come from here.
    """

    def __init__(self, mode: str, cap: int):
        self.mode = mode
        self.cap = max(0, int(cap))
        on = mode != NONE and self.cap > 0
        #: keeps erred tasks
        self.keeps_erred = on
        #: ``finished(group, key, kwargs)``, or None when finished tasks are not kept
        self.finished = (
            {SLOWEST: self._slowest, ALL: self._first}.get(mode) if on else None
        )
        self.groups: dict[TaskGroup, GroupTasks] = {}
        #: task group -> ``[earliest start, latest stop]`` of the compute of its
        #: tasks that erred since :meth:`take_erred_window` last took it
        self.erred_windows: dict[TaskGroup, list[float]] = {}
        #: task group -> ``{(what names the class, type name): count}`` of its tasks
        #: that erred while they ran since :meth:`take_erred_classes` last took it
        self.erred_classes: dict[TaskGroup, dict[ErredClass, int]] = {}
        self._tie = itertools.count()

    def _of(self, group: TaskGroup) -> GroupTasks:
        tasks = self.groups.get(group)
        if tasks is None:
            tasks = self.groups[group] = GroupTasks()
        return tasks

    def erred(self, group: TaskGroup, key: Key, kwargs: TransitionKwargs,
              run_spec: object = None) -> None:
        """A task of ``group`` erred while it ran (``processing -> erred``):
        its compute times widen the group's erred window, its exception's class is
        counted; its record is kept when ``mode`` keeps erred tasks and the cap
        leaves room. O(1)."""
        classes = self.erred_classes.get(group)
        if classes is None:
            classes = self.erred_classes[group] = {}
        cls: ErredClass = (exception_class(kwargs.get("exception")),
               exception_name(kwargs.get("exception_text")))
        if cls not in classes and len(classes) >= MAX_ERROR_CLASSES:
            cls = (None, "")
        classes[cls] = classes.get(cls, 0) + 1
        start, stop = compute_times(kwargs)
        if stop:
            window = self.erred_windows.get(group)
            if window is None:
                self.erred_windows[group] = [start, stop]
            else:
                if start < window[0]:
                    window[0] = start
                if stop > window[1]:
                    window[1] = stop
        if not self.keeps_erred:
            return
        tasks = self._of(group)
        tasks.erred_seen += 1
        if len(tasks.erred) < self.cap:
            tasks.erred.append(task_record(key, kwargs, True, run_spec))

    def take_erred_classes(self, group: TaskGroup
                           ) -> list[tuple[str | bytes | None, str, int]]:
        """``[(what names the class, type name, count), ...]`` of the tasks of
        ``group`` that erred while they ran since it was last taken."""
        classes = self.erred_classes.pop(group, None)
        if not classes:
            return []
        return [(origin, name, n) for (origin, name), n in classes.items()]

    def _slowest(self, group: TaskGroup, key: Key, kwargs: TransitionKwargs,
                 run_spec: object = None) -> None:
        tasks = self._of(group)
        tasks.others_seen += 1
        seconds = compute_seconds(kwargs)
        heap = tasks.others
        if len(heap) < self.cap:
            heapq.heappush(heap, (seconds, next(self._tie),
                                  task_record(key, kwargs, False, run_spec)))
        elif seconds > heap[0][0]:
            heapq.heapreplace(heap, (seconds, next(self._tie),
                                     task_record(key, kwargs, False, run_spec)))

    def _first(self, group: TaskGroup, key: Key, kwargs: TransitionKwargs,
               run_spec: object = None) -> None:
        tasks = self._of(group)
        tasks.others_seen += 1
        if len(tasks.others) < self.cap:
            tasks.others.append((0.0, 0, task_record(key, kwargs, False, run_spec)))

    def take_over(self, previous: TaskSampler) -> None:
        """Go on with what ``previous`` (the sampler of the plugin registered before,
        with the same settings) kept."""
        self.groups.update(previous.groups)
        self.erred_windows.update(previous.erred_windows)
        self.erred_classes.update(previous.erred_classes)

    def forget(self) -> None:
        """Forget everything kept (the scheduler is closing: it was all taken)."""
        self.groups.clear()
        self.erred_windows.clear()
        self.erred_classes.clear()

    def take(self, group: TaskGroup) -> GroupTasks | None:
        """The tasks kept of ``group`` since it was last taken, forgotten here."""
        return self.groups.pop(group, None)

    def take_erred_window(self, group: TaskGroup) -> tuple[float, float]:
        """``(earliest start, latest stop)`` of the compute of the tasks of
        ``group`` that erred since it was last taken (``(0.0, 0.0)`` when none
        reported one), forgotten here."""
        window = self.erred_windows.pop(group, None)
        return (window[0], window[1]) if window is not None else (0.0, 0.0)

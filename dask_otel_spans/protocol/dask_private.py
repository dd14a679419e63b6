"""Every use of dask's and distributed's private names, in one place, with what each
release offers: the attributes of ``distributed.spans.Span`` that the package reads
(the scheduler's spans) and fills (the export side's copy of them), the forms of a
task's run spec (:func:`task_function`), and a check that the installed releases
have each name, so that one a release lacks degrades the one thing that needs it,
said once, by name, never the plugin.
"""
from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Hashable, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from distributed.client import SourceCode
    from distributed.spans import Span

logger = logging.getLogger(__name__)

#: The first dask release with ``dask._task_spec.Task``, the run spec distributed's
#: scheduler keeps from distributed 2024.11.0 on (before: a tuple ``(func, *args)``)
TASK_SPEC_SINCE = "2024.9.0"

#: The private attributes of ``distributed.spans.Span`` the package uses (every
#: distributed from 2024.1.0 on has them), and what goes without each
SPAN_PRIVATE_ATTRIBUTES = {
    # its own fine metrics, without its children's
    "_cumulative_worker_metrics": "the dask spans' activity attributes and metrics",
    # the client's source snippets (``include-code``)
    "_code": "the dask spans' code snippets",
    # the scheduler's thread-count history it refers to, and where in it it began
    "_total_nthreads_history": "the dask spans' thread-seconds",
    "_total_nthreads_offset": "the dask spans' thread-seconds",
}
#: What goes without ``dask._task_spec.Task`` where the release should have it
TASK_SPEC_USE = "code.function.name on task spans of dask Task run specs"


def cumulative_metrics(span: Span) -> MutableMapping[Hashable, float]:
    """The span's own fine metrics ``{(context, prefix, activity, unit): value}``
    (without its children's), as distributed sums them; an empty dict where the
    span has none."""
    metrics = getattr(span, "_cumulative_worker_metrics", None)
    return metrics if metrics is not None else {}


def code_snippets(span: Span) -> MutableMapping[tuple[SourceCode, ...], None]:
    """The span's source code snippets, in the order the client sent them (an
    insertion-ordered dict of snippets); empty where it has none."""
    code = getattr(span, "_code", None)
    return code if code is not None else {}


def nthreads_history(span: Span) -> Sequence[tuple[float, int]]:
    """The scheduler's ``total_nthreads_history`` the span refers to."""
    return getattr(span, "_total_nthreads_history", ())


def nthreads_offset(span: Span) -> int:
    """Where in :func:`nthreads_history` the span began."""
    return getattr(span, "_total_nthreads_offset", 0)


def set_nthreads_offset(span: Span, offset: int) -> None:
    """Set where in :func:`nthreads_history` a span of the export side's copy
    began."""
    span._total_nthreads_offset = offset


def task_function(run_spec: object) -> Callable[..., Any] | None:
    """The function a task's run spec calls, in each form the scheduler keeps it:

    - a ``dask._task_spec.Task`` (distributed 2024.11.0 and later): its ``func``;
    - a tuple ``(func, *args)`` (distributed before 2024.11.0: a dask task as
      ``dask.core.istask`` says), ``dask.utils.apply(func, args, kwargs)`` (a
      submission with keyword arguments) seen through to ``func``;

    None for anything else: data, an alias, another ``GraphNode``, and fused
    subgraphs (a ``SubgraphCallable`` in a tuple, named by a random token, or a
    ``Task`` of ``dask._task_spec._execute_subgraph``): none is the user's function.
    """
    task = task_class()
    func: object
    if task is not None and type(run_spec) is task:
        func = getattr(run_spec, "func", None)
        if func is _execute_subgraph():
            return None
    elif type(run_spec) is tuple and run_spec and callable(run_spec[0]):
        func = run_spec[0]
        if func is _apply() and len(run_spec) > 1:
            func = run_spec[1]
    else:
        return None
    if not callable(func) or type(func).__name__ == "SubgraphCallable":
        return None
    return cast("Callable[..., Any]", func)


@functools.cache
def _apply() -> object:
    from dask.utils import apply

    return apply


@functools.cache
def _execute_subgraph() -> object:
    try:
        from dask._task_spec import _execute_subgraph
    except ImportError:
        return None
    return _execute_subgraph


@functools.cache
def task_class() -> type | None:
    """``dask._task_spec.Task`` when the installed dask has it, else None (dask
    before :data:`TASK_SPEC_SINCE`; a later one without it is said by
    :func:`check_private_names`)."""
    try:
        from dask._task_spec import Task
    except ImportError:
        return None
    return Task


def _dask_version() -> str:
    import dask

    return str(getattr(dask, "__version__", "0"))


def _dask_at_least(release: str) -> bool:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(_dask_version()) >= Version(release)
    except InvalidVersion:
        return True


def missing_private_names() -> dict[str, str]:
    """The private names the package uses that the installed dask and distributed
    lack though their releases should have them, each as ``module.Class.name``, with
    what goes without it (empty when they have them all)."""
    from distributed.spans import Span

    span = Span(("probe",), "probe", None, [(0.0, 0)])
    missing = {f"distributed.spans.Span.{name}": use
               for name, use in SPAN_PRIVATE_ATTRIBUTES.items() if not hasattr(span, name)}
    if _dask_at_least(TASK_SPEC_SINCE) and task_class() is None:
        missing["dask._task_spec.Task"] = TASK_SPEC_USE
    return missing


def check_private_names() -> None:
    """Say (a WARNING, once per name and process) each private name the installed
    releases lack, and what goes without it (the attributes that read it, never the
    plugin); the scheduler plugin calls it as it starts."""
    try:
        missing = missing_private_names()
    except Exception as e:  # (a release whose Span cannot even be made so)
        missing = {"distributed.spans.Span": f"this check ({type(e).__name__}: {e})"}
    for name, use in missing.items():
        _say_missing(name, use)


@functools.cache
def _say_missing(name: str, use: str) -> None:
    import dask
    import distributed

    logger.warning("dask_otel_spans: dask %s / distributed %s has no %s: %s left out "
                   "(dask_otel_spans/protocol/dask_private.py)",
                   getattr(dask, "__version__", "?"), getattr(distributed, "__version__", "?"),
                   name, use)

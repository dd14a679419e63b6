"""dask's private names read through one module: each form of a task's run spec that
a release keeps, and a name a release lacks said once, by name."""
from __future__ import annotations

import functools
import logging

import dask
import dask.array as da
import distributed
from dask.utils import apply

from dask_otel_spans.protocol import dask_private
from dask_otel_spans.protocol.dask_private import check_private_names, task_function
from dask_otel_spans.scheduler.sampler import function_name


def double(x: int, k: int = 1) -> int:
    return 2 * x * k


def test_a_task_of_the_installed_dask_names_its_function():
    # (a dask Task in newer releases, a tuple in 2024.10.0 and older: the scheduler
    # keeps it as the graph has it)
    task = dict(dask.delayed(double)(2, dask_key_name="d").__dask_graph__())["d"]
    assert task_function(task) is double


def test_a_task_tuple_of_older_releases_names_its_function():
    # (distributed before 2024.11 keeps a task as dask.core did: (func, *args), and a
    # submission with keyword arguments as apply(func, args, kwargs))
    assert task_function((double, 1)) is double
    assert task_function((apply, double, [1], {"k": 2})) is double
    assert function_name((functools.partial(double, k=3), 1)) == "double"


def test_data_names_no_function():
    for data in (1, "x", ("x", 0), (), None, [double, 1], {"f": double}):
        assert task_function(data) is None


def test_a_fused_subgraph_names_no_function():
    (optimized,) = dask.optimize((da.ones(10, chunks=5) + 1).sum())
    graph = dict(optimized.__dask_graph__())
    # (a SubgraphCallable, named by a random token, in older releases; a Task of
    # _execute_subgraph in newer ones)
    fused = [task for task in graph.values() if "subgraph" in repr(task)]
    assert fused
    assert [function_name(task) for task in fused] == [None] * len(fused)


def test_a_private_name_the_release_lacks_is_said_once_with_what_goes(
        monkeypatch, caplog):
    monkeypatch.setitem(dask_private.SPAN_PRIVATE_ATTRIBUTES, "_renamed_by_a_release",
                        "what reads it")
    with caplog.at_level(logging.WARNING, logger=dask_private.__name__):
        check_private_names()
        check_private_names()
    [record] = [r for r in caplog.records if "_renamed_by_a_release" in r.getMessage()]
    message = record.getMessage()
    assert "distributed.spans.Span._renamed_by_a_release" in message
    assert "what reads it left out" in message
    assert f"distributed {distributed.__version__}" in message

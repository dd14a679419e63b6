"""The semantic conventions for errors and code on in-process clusters exporting to
memory: ``error.type`` on erred task, prefix and dask spans (the most frequent type,
the description counting each), ``exception.type`` as the SDK writes it,
``code.function.name`` on task spans."""
from __future__ import annotations

import dask
from distributed import wait
from distributed.utils_test import gen_cluster
from opentelemetry.trace import StatusCode
from support.failures import bad_json, bad_record, mixed
from support.plugin import install
from support.providers import MemoryProviders

from dask_otel_spans import names, span


def double(x: int) -> int:
    return 2 * x


async def erred_in_span(c, name: str, submit) -> MemoryProviders:
    """Run ``submit(c)``'s futures in dask span ``name``, exported to memory."""
    memory = MemoryProviders()
    await install(c, memory)
    with span(name):
        await wait(submit(c))
    await memory.first(name)
    return memory


@gen_cluster(client=True)
async def test_an_erred_task_span_has_error_type_and_the_sdks_exception_type(c, s, a, b):
    memory = await erred_in_span(c, "parse", lambda c: c.map(bad_json, range(2)))
    spans = memory.task_spans("bad_json")
    assert len(spans) == 2
    for task in spans:
        assert task.status.status_code == StatusCode.ERROR
        assert task.attributes[names.ERROR_TYPE] == "json.decoder.JSONDecodeError"
        (event,) = [e for e in task.events if e.name == names.EXCEPTION_EVENT]
        assert event.attributes[names.EXCEPTION_TYPE] == "json.decoder.JSONDecodeError"


@gen_cluster(client=True)
async def test_a_user_defined_nested_exception_class_is_named_with_its_module(c, s, a, b):
    memory = await erred_in_span(c, "records", lambda c: c.submit(bad_record, 1))
    (task,) = memory.task_spans("bad_record")
    assert task.attributes[names.ERROR_TYPE] == "support.failures.Outer.BadRecord"


@gen_cluster(client=True)
async def test_prefix_and_dask_spans_carry_the_most_frequent_error_type(c, s, a, b):
    # (0 and 3: KeyError; 1, 2, 4, 5: ValueError)
    memory = await erred_in_span(c, "mixtures", lambda c: c.map(mixed, range(6)))
    dask_span = await memory.first("mixtures")
    described = "6 tasks erred: 4 ValueError, 2 KeyError"
    for otel_span in (dask_span, memory.prefix_span("mixed")):
        assert otel_span.attributes[names.ERROR_TYPE] == "ValueError"
        assert otel_span.status.status_code == StatusCode.ERROR
        assert otel_span.status.description == described


@gen_cluster(client=True)
async def test_one_error_type_is_named_alone(c, s, a, b):
    memory = await erred_in_span(c, "one kind", lambda c: c.submit(bad_record, 2))
    dask_span = await memory.first("one kind")
    assert dask_span.attributes[names.ERROR_TYPE] == "support.failures.Outer.BadRecord"
    assert dask_span.status.description == "1 task erred: 1 support.failures.Outer.BadRecord"


@gen_cluster(client=True)
async def test_spans_without_errors_have_no_error_type(c, s, a, b):
    memory = MemoryProviders()
    await install(c, memory)
    with span("fine"):
        await c.submit(double, 1)
    dask_span = await memory.first("fine")
    assert names.ERROR_TYPE not in dask_span.attributes
    assert names.ERROR_TYPE not in memory.prefix_span("double").attributes


@gen_cluster(client=True)
async def test_task_spans_name_the_function_of_a_submission_and_of_a_collection(
        c, s, a, b):
    memory = MemoryProviders()
    await install(c, memory, task_spans="all")
    with span("code"):
        await c.submit(double, 1, key="submitted-1")
        await c.compute(dask.delayed(double)(2, dask_key_name="delayed-1"))
    await memory.first("code")
    functions = {s.attributes[names.TASK_KEY]: s.attributes.get(names.CODE_FUNCTION_NAME)
                 for s in memory.spans() if names.TASK_KEY in (s.attributes or {})}
    assert functions == {"submitted-1": "double", "delayed-1": "double"}

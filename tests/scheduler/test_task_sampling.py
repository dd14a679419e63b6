"""Which tasks get task spans (pure: no cluster), and how an erred task's record
becomes its span's fields."""
from __future__ import annotations

import traceback

import pytest
from distributed.core import error_message

from dask_otel_spans import names
from dask_otel_spans.export.task_spans import (
    exception_attributes,
    exception_parts,
    task_span_fields,
)
from dask_otel_spans.export.tracking.samples import PrefixTasks
from dask_otel_spans.protocol.tasks import (
    ALL,
    ERRED,
    MAX_EXCEPTION_MESSAGE_LENGTH,
    NONE,
    SLOWEST,
    TaskRecord,
)
from dask_otel_spans.scheduler.sampler import TaskSampler, task_record


def finished(seconds: float, start: float = 100.0, **extra) -> dict:
    return {"startstops": [{"action": "compute", "start": start,
                            "stop": start + seconds}],
            "worker": "tcp://127.0.0.1:1", "nbytes": 28, **extra}


def erred(text: str = "ValueError('boom')") -> dict:
    return {"startstops": [{"action": "compute", "start": 1.0, "stop": 2.0}],
            "worker": "tcp://127.0.0.1:2", "exception_text": text,
            "traceback_text": '  File "x.py", line 3, in f\n    raise ValueError\n'}


def records_of(sampler: TaskSampler, group: str) -> list[TaskRecord]:
    taken = sampler.take(group)
    records, _, _ = taken.message_fields()
    return [TaskRecord._make(r) for r in records]


@pytest.mark.parametrize("text, expected", [
    ("ValueError('boom 3')", ("ValueError", "boom 3")),
    ("KeyError('a', 2)", ("KeyError", "('a', 2)")),
    ("RuntimeError()", ("RuntimeError", "")),
    ("mod.CustomError(\"it's\\nbad\")", ("mod.CustomError", "it's\nbad")),
    ("<not a repr>", ("Exception", "<not a repr>")),
    ("Odd(object at 0x1)", ("Odd", "object at 0x1")),
])
def test_exception_type_and_message_are_read_from_its_repr(text, expected):
    assert exception_parts(text) == expected


#: Exceptions whose ``str`` is their argument, is not (KeyError quotes it, OSError
#: says its errno), or is the tuple of their arguments
EXCEPTIONS = [
    KeyError("bad record 3"), KeyError(3), KeyError(), ValueError("boom"),
    ValueError("bad", 3), KeyError("a", 2), FileNotFoundError(2, "No such file"),
    UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"),
]
EXCEPTION_IDS = [repr(e) for e in EXCEPTIONS]


def sent_by_a_worker(exc: BaseException) -> dict:
    """The erred task's ``transition`` keyword arguments for ``exc`` raised in a
    task: ``exception_text`` and ``traceback_text`` as dask's worker makes them."""
    try:
        raise exc
    except BaseException as e:
        msg = error_message(e)
    return {**erred(), "exception_text": msg["exception_text"],
            "traceback_text": msg["traceback_text"]}


@pytest.mark.parametrize("exc", EXCEPTIONS, ids=EXCEPTION_IDS)
def test_exception_message_is_str_of_the_exception_the_worker_sent(exc):
    record = task_record("f-1", sent_by_a_worker(exc), True)
    attributes = exception_attributes(record, with_details=True)
    assert attributes[names.EXCEPTION_TYPE] == type(exc).__name__
    assert attributes[names.EXCEPTION_MESSAGE] == str(exc)


@pytest.mark.parametrize("exc", EXCEPTIONS, ids=EXCEPTION_IDS)
def test_the_stacktrace_ends_with_the_exception_line_python_prints(exc):
    record = task_record("f-1", sent_by_a_worker(exc), True)
    trace = exception_attributes(record, with_details=True)[names.EXCEPTION_STACKTRACE]
    (line,) = traceback.format_exception_only(type(exc), exc)
    assert trace.endswith("\n" + line.rstrip("\n"))


def test_a_record_has_the_compute_times_and_the_other_actions_as_actions():
    kwargs = finished(0.5)
    kwargs["startstops"].insert(0, {"action": "transfer", "start": 99.0, "stop": 99.5,
                                    "source": "tcp://x"})
    record = task_record(("inc-1", 3), kwargs, False)
    assert record.key == "('inc-1', 3)"
    assert (record.start, record.stop, record.nbytes) == (100.0, 100.5, 28)
    assert record.actions == (("transfer", 99.0, 99.5),)
    assert not record.erred


def test_an_erred_record_keeps_its_exception_cut_to_the_documented_length():
    record = task_record("f-1", erred("ValueError('" + "x" * 10_000 + "')"), True)
    assert record.erred and record.nbytes == -1
    assert len(record.exception) == MAX_EXCEPTION_MESSAGE_LENGTH


def test_under_erred_finished_tasks_are_not_looked_at():
    sampler = TaskSampler(ERRED, 10)
    assert sampler.finished is None
    sampler.erred("g", "f-1", erred())
    assert [r.key for r in records_of(sampler, "g")] == ["f-1"]


def test_under_none_nothing_is_kept():
    sampler = TaskSampler(NONE, 10)
    sampler.erred("g", "f-1", erred())
    assert sampler.finished is None and sampler.take("g") is None


@pytest.mark.parametrize("mode, cap", [(NONE, 10), (ERRED, 1)],
                         ids=["task-spans none", "past the cap"])
def test_an_erred_task_widens_its_groups_erred_window_whatever_is_kept(mode, cap):
    sampler = TaskSampler(mode, cap)
    for start, stop in [(5.0, 6.0), (4.0, 4.5), (5.5, 7.0)]:
        kwargs = erred()
        kwargs["startstops"] = [{"action": "compute", "start": start, "stop": stop}]
        sampler.erred("g", "f-1", kwargs)
    sampler.erred("g", "f-2", {"exception_text": "KilledWorker()"})  # (no compute)
    assert sampler.take_erred_window("g") == (4.0, 7.0)
    assert sampler.take_erred_window("g") == (0.0, 0.0)  # (taken: forgotten)


def test_a_group_keeps_its_slowest_tasks_up_to_the_cap():
    sampler = TaskSampler(SLOWEST, 3)
    for i, seconds in enumerate([0.1, 0.9, 0.2, 0.8, 0.05, 0.7]):
        sampler.finished("g", f"f-{i}", finished(seconds))
    kept = sorted(r.stop - r.start for r in records_of(sampler, "g"))
    assert kept == pytest.approx([0.7, 0.8, 0.9])


def test_a_prefix_keeps_the_erred_first_then_the_slowest_within_the_cap():
    tasks = PrefixTasks(cap=3, slowest=True)
    group = TaskSampler(SLOWEST, 3)
    for i, seconds in enumerate([0.3, 0.1, 0.5]):
        group.finished("g1", f"f-{i}", finished(seconds))
    group.erred("g2", "f-err", erred())
    for g in ("g1", "g2"):
        tasks.add(*group.take(g).message_fields())
    chosen = tasks.chosen()
    assert [r.key for r in chosen] == ["f-err", "f-2", "f-0"]
    assert tasks.left_out == 1  # 4 could have had a span, 3 have one


def test_under_all_a_prefix_keeps_the_first_tasks_that_came():
    tasks = PrefixTasks(cap=2, slowest=False)
    sampler = TaskSampler(ALL, 2)
    for g in ("g1", "g2"):
        for i in range(2):
            sampler.finished(g, f"{g}-{i}", finished(0.1 * (i + 1)))
        tasks.add(*sampler.take(g).message_fields())
    assert [r.key for r in tasks.chosen()] == ["g1-0", "g1-1"]
    assert tasks.left_out == 2


def test_an_erred_task_span_has_status_error_and_an_exception_event():
    record = task_record("f-1", erred("ValueError('boom')"), True)
    (fields,) = task_span_fields("0" * 32, "f", [record], default_start=0.0,
                                 default_stop=5.0)
    assert fields.error == "ValueError"
    (event,) = fields.events
    assert event.name == names.EXCEPTION_EVENT
    assert event.attributes[names.EXCEPTION_TYPE] == "ValueError"
    assert event.attributes[names.EXCEPTION_MESSAGE] == "boom"
    trace = event.attributes[names.EXCEPTION_STACKTRACE]
    assert trace.startswith("Traceback (most recent call last):\n  File \"x.py\"")
    assert trace.endswith("ValueError: boom")
    assert names.TASK_NBYTES not in fields.attributes
    assert (fields.start_ns, fields.end_ns) == (1_000_000_000, 2_000_000_000)


def test_without_recorded_exceptions_the_event_keeps_the_type_only():
    record = task_record("f-1", erred(), True)
    (fields,) = task_span_fields("0" * 32, "f", [record], default_start=0.0,
                                 default_stop=5.0, record_exceptions=False)
    (event,) = fields.events
    assert event.attributes == {names.EXCEPTION_TYPE: "ValueError"}


def test_a_task_without_compute_times_takes_its_prefix_span_times():
    record = task_record("f-1", {"exception_text": "KilledWorker()"}, True)
    (fields,) = task_span_fields("0" * 32, "f", [record], default_start=3.0,
                                 default_stop=4.0)
    assert (fields.start_ns, fields.end_ns) == (3_000_000_000, 4_000_000_000)

"""``OTEL_SEMCONV_EXCEPTION_SIGNAL_OPT_IN``: erred tasks' exceptions as span events
(unset), as log events named ``exception`` in the task span's context (``logs``), or
both (``logs/dup``): to the embedded default's ``logs.jsonl`` (read back by
``dask-otel-spans tree``) and, from the export process, to a real OTLP receiver."""
from __future__ import annotations

import pytest
from distributed import wait
from distributed.utils_test import gen_cluster
from support.failures import bad_json
from support.plugin import FAST
from support.polling import async_wait_for
from support.processes import otlp_grpc_env
from support.receivers import RECEIVER_THREADS

from dask_otel_spans import OTelSpansPlugin, names, span
from dask_otel_spans.cli import main as cli_main
from dask_otel_spans.sdk.logs import EXCEPTION_SIGNAL_OPT_IN, ExceptionSignals
from dask_otel_spans.sdk.otlpjson import LOGS_FILE, read_log_records, read_spans

JSON_ERROR = "json.decoder.JSONDecodeError"


@pytest.mark.parametrize("value, signals", [
    (None, ExceptionSignals(events=True, logs=False)),
    ("logs", ExceptionSignals(events=False, logs=True)),
    ("logs/dup", ExceptionSignals(events=True, logs=True)),
    ("http, logs", ExceptionSignals(events=False, logs=True)),
    ("nonsense", ExceptionSignals(events=True, logs=False)),
])
def test_the_opt_in_picks_the_exception_signals(value, signals):
    environ = {} if value is None else {EXCEPTION_SIGNAL_OPT_IN: value}
    assert ExceptionSignals.from_environ(environ) == signals


def embedded(tmp_path, opt_in: str | None) -> OTelSpansPlugin:
    environ = {} if opt_in is None else {EXCEPTION_SIGNAL_OPT_IN: opt_in}
    return OTelSpansPlugin(environ=environ, use_global_providers=False,
                           output_dir=str(tmp_path), export_process=False,
                           export_delay=0.1, idle_timeout=1.0)


def task_spans(tmp_path) -> list[dict]:
    path = tmp_path / "traces.jsonl"
    spans = read_spans(str(path)) if path.exists() else []
    return [s for s in spans if names.TASK_KEY in s["attributes"]]


def exception_events(task: dict) -> list[dict]:
    return [e for e in task.get("events") or () if e["name"] == names.EXCEPTION_EVENT]


async def run_erring_span(c, plugin, tmp_path) -> list[dict]:
    await c.register_plugin(plugin)
    with span("parse"):
        await wait(c.map(bad_json, range(2)))
    await async_wait_for(lambda: len(task_spans(tmp_path)) == 2, timeout=15)
    await c.run_on_scheduler(lambda dask_scheduler: dask_scheduler.plugins[
        names.PLUGIN_NAME].transport.flush(10))
    return task_spans(tmp_path)


def log_events(tmp_path) -> list[dict]:
    """The exception log events of the embedded default's logs.jsonl (which also
    holds the records of running spans)."""
    path = tmp_path / LOGS_FILE
    return [r for r in read_log_records(str(path))
            if r.get("eventName") == names.EXCEPTION_EVENT] if path.exists() else []


@gen_cluster(client=True)
async def test_unset_the_exceptions_are_span_events_only(c, s, a, b, tmp_path):
    tasks = await run_erring_span(c, embedded(tmp_path, None), tmp_path)
    assert all(len(exception_events(t)) == 1 for t in tasks)
    assert log_events(tmp_path) == []


@gen_cluster(client=True)
async def test_logs_makes_them_log_events_in_the_task_spans_context(c, s, a, b, tmp_path):
    tasks = await run_erring_span(c, embedded(tmp_path, "logs"), tmp_path)
    assert all(exception_events(t) == [] for t in tasks)
    records = log_events(tmp_path)
    assert sorted((r["traceId"], r["spanId"]) for r in records) == sorted(
        (t["traceId"], t["spanId"]) for t in tasks)
    for record in records:
        assert record["eventName"] == names.EXCEPTION_EVENT
        assert (record["severityNumber"], record["severityText"]) == (17, "ERROR")
        assert record["attrs"][names.EXCEPTION_TYPE] == JSON_ERROR
        assert record["attrs"][names.EXCEPTION_MESSAGE].startswith("Expecting")
        assert "Traceback" in record["attrs"][names.EXCEPTION_STACKTRACE]


@gen_cluster(client=True)
async def test_logs_dup_makes_both(c, s, a, b, tmp_path):
    tasks = await run_erring_span(c, embedded(tmp_path, "logs/dup"), tmp_path)
    assert all(len(exception_events(t)) == 1 for t in tasks)
    assert len(log_events(tmp_path)) == 2


@gen_cluster(client=True)
async def test_the_tree_shows_the_exceptions_of_the_log_events(
        c, s, a, b, tmp_path, capsys):
    await run_erring_span(c, embedded(tmp_path, "logs"), tmp_path)
    assert cli_main(["tree", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("✗ ") == 2
    assert out.count(f"{JSON_ERROR}: Expecting") == 2


@gen_cluster(client=True, clean_kwargs=RECEIVER_THREADS)
async def test_the_export_process_sends_exception_logs_over_otlp(
        c, s, a, b, otlp_receiver):
    environ = {**otlp_grpc_env(otlp_receiver), "OTEL_LOGS_EXPORTER": "otlp",
               EXCEPTION_SIGNAL_OPT_IN: "logs"}
    plugin = OTelSpansPlugin(environ=environ, use_global_providers=False,
                             export_process=True, **FAST)
    await c.register_plugin(plugin)
    with span("parse"):
        await wait(c.map(bad_json, range(2)))

    def exception_records():
        return [(resource, record) for resource, record in otlp_receiver.log_records()
                if record.event_name == names.EXCEPTION_EVENT]

    def task_spans():
        return {(s["traceId"], s["spanId"]) for s in otlp_receiver.spans()
                if names.TASK_KEY in s["attributes"]}

    # (the records and the task spans go by two exporters, each at its own pace)
    await async_wait_for(lambda: len(exception_records()) == 2
                         and len(task_spans()) >= 2, timeout=20)
    tasks = task_spans()
    for _, record in exception_records():
        assert record.event_name == names.EXCEPTION_EVENT
        assert (record.trace_id.hex(), record.span_id.hex()) in tasks
        assert {kv.key: kv.value.string_value for kv in record.attributes}[
            names.EXCEPTION_TYPE] == JSON_ERROR


class RefusingLogger:
    def emit(self, *args, **kwargs):
        raise TypeError("emit() got an unexpected keyword argument 'event_name'")


class RefusingLoggerProvider:
    def get_logger(self, *args, **kwargs):
        return RefusingLogger()


def test_a_logger_that_refuses_the_record_loses_no_span(memory, caplog):
    """An SDK whose log API takes no keywords: one ERROR line, and the exception goes
    back to being a span event; every span is still ended."""
    from dask_otel_spans.export.ender import SpanEnder
    from dask_otel_spans.export.task_spans import TaskEvent, TaskSpanFields
    from dask_otel_spans.export.traces import SpanFields
    from dask_otel_spans.export.writers import span_writer
    from dask_otel_spans.protocol.propagation import resolve_chain

    ender = SpanEnder(span_writer(memory.tracer_provider, owned=False),
                      exception_events=False, logger_provider=RefusingLoggerProvider())
    event = TaskEvent(names.EXCEPTION_EVENT, 2_000, {names.EXCEPTION_TYPE: "ValueError"})
    tasks = [TaskSpanFields("inc", i + 1, 1_000, 3_000, {}, [event], "ValueError")
             for i in range(2)]
    ids = resolve_chain(["0eadd631-e68b-495e-b072-7765d0d61002"], {})
    with caplog.at_level("ERROR", logger="dask_otel_spans"):
        ender.export(SpanFields("wf", ids, 1_000, 3_000, {}, None, [], tasks))
    task_spans = memory.by_name("inc")
    assert len(task_spans) == 2
    assert all([e.name for e in s.events] == [names.EXCEPTION_EVENT] for s in task_spans)
    assert len([r for r in caplog.records if "exception log events" in r.message]) == 1


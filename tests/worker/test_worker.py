"""The worker side on in-process clusters: task code runs in the OTel context of its
prefix span inside the dask span the scheduler put it in; log records carry it."""
from __future__ import annotations

import asyncio
import logging
import sys

import pytest
from distributed import span as dask_span
from distributed.utils_test import gen_cluster
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from dask_otel_spans import OTelWorkerPlugin, names, span
from dask_otel_spans.protocol.propagation import (
    otel_span_id,
    otel_trace_id,
    prefix_span_id,
)
from dask_otel_spans.worker.plugin import flush_providers
from dask_otel_spans.worker.providers import (
    WorkerProviders,
    build_worker_providers,
    worker_label,
)

#: exporters off: nothing is installed as this test process's global providers
NO_EXPORT = {"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"}


def current_ids(x: int = 0) -> tuple[int, int, bool]:
    """In a task: the trace id, span id and sampled flag of the current span."""
    ctx = trace.get_current_span().get_span_context()
    return ctx.trace_id, ctx.span_id, ctx.trace_flags.sampled


async def current_ids_async(x: int = 0) -> tuple[int, int, bool]:
    await asyncio.sleep(0)
    return current_ids()


def logged_fields(x: int = 0) -> dict:
    """In a task: the trace fields of a log record made there."""
    record = logging.getLogger("task code").makeRecord(
        "task code", logging.WARNING, __file__, 1, "a warning", (), None
    )
    return {name: getattr(record, name, None) for name in
            ("otelTraceID", "otelSpanID", "otelTraceSampled", "otelServiceName")}


async def with_plugin(c, **kwargs) -> None:
    await c.register_plugin(OTelWorkerPlugin(environ=NO_EXPORT, **kwargs))


def client_span(sampled: bool = True) -> NonRecordingSpan:
    return NonRecordingSpan(SpanContext(
        0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, is_remote=False,
        trace_flags=TraceFlags(TraceFlags.SAMPLED if sampled else 0),
    ))


@gen_cluster(client=True)
async def test_a_task_runs_in_its_prefix_span_in_the_client_trace(c, s, a, b):
    await with_plugin(c)
    parent = client_span()
    with trace.use_span(parent):
        with span("etl") as span_id:
            got = await c.submit(current_ids, 1, key="current_ids-1")
    assert got == (parent.get_span_context().trace_id,
                   prefix_span_id(span_id, "current_ids"), True)


@gen_cluster(client=True)
async def test_a_plain_distributed_span_gives_the_root_span_trace(c, s, a, b):
    await with_plugin(c)
    with dask_span("outer") as outer_id:
        with dask_span("inner") as inner_id:
            got = await c.submit(current_ids, 1, key="current_ids-1")
    assert got == (otel_trace_id(outer_id), prefix_span_id(inner_id, "current_ids"),
                   True)


@gen_cluster(client=True)
async def test_a_task_of_the_default_span_runs_in_that_span(c, s, a, b):
    await with_plugin(c)
    got = await c.submit(current_ids, 1, key="current_ids-1")
    (default_id,) = [sid for sid, sp in s.extensions["spans"].spans.items()
                     if sp.name == ("default",)]
    assert got == (otel_trace_id(default_id), prefix_span_id(default_id, "current_ids"),
                   True)


@gen_cluster(client=True)
async def test_without_prefix_spans_a_task_runs_in_the_dask_span(c, s, a, b):
    await with_plugin(c, prefix_spans=False)
    with span("etl") as span_id:
        got = await c.submit(current_ids, 1, key="current_ids-1")
    assert got[1] == otel_span_id(span_id)


@gen_cluster(client=True)
async def test_an_unsampled_client_context_gives_tasks_an_unsampled_context(
        c, s, a, b):
    await with_plugin(c)
    with trace.use_span(client_span(sampled=False)):
        with span("etl"):
            got = await c.submit(current_ids, 1, key="current_ids-1")
    assert got[2] is False


@gen_cluster(client=True)
async def test_an_async_task_runs_in_its_span_context(c, s, a, b):
    await with_plugin(c)
    with span("etl") as span_id:
        got = await c.submit(current_ids_async, 1, key="current_ids_async-1")
    assert got[1] == prefix_span_id(span_id, "current_ids_async")


@gen_cluster(client=True)
async def test_a_task_moved_to_an_earlier_span_runs_in_that_span(c, s, a, b):
    await with_plugin(c)
    with span("first") as first_id:
        await c.submit(current_ids, 1, key="current_ids-1")
    with span("second"):  # (group current_ids belongs to "first": dask keeps it there)
        got = await c.submit(current_ids, 2, key="current_ids-2")
    assert got[1] == prefix_span_id(first_id, "current_ids")


@gen_cluster(client=True)
async def test_log_records_made_in_a_task_carry_its_trace_context(c, s, a, b):
    await with_plugin(c)
    parent = client_span()
    with trace.use_span(parent):
        with span("etl") as span_id:
            fields = await c.submit(logged_fields, 1, key="logged_fields-1")
    assert fields == {
        "otelTraceID": f"{parent.get_span_context().trace_id:032x}",
        "otelSpanID": f"{prefix_span_id(span_id, 'logged_fields'):016x}",
        "otelTraceSampled": True,
        "otelServiceName": "",  # (no provider built here: no resource)
    }


@gen_cluster(client=True)
async def test_log_records_off_tasks_carry_zero_ids(c, s, a, b):
    await with_plugin(c)
    assert logged_fields()["otelTraceID"] == "0"


@gen_cluster(client=True)
async def test_removing_the_plugin_puts_back_execute_and_the_record_factory(
        c, s, a, b):
    factory = logging.getLogRecordFactory()
    await with_plugin(c)
    assert "execute" in a.__dict__
    await c.unregister_worker_plugin(names.WORKER_PLUGIN_NAME)
    assert "execute" not in a.__dict__ and "execute" not in b.__dict__
    assert logging.getLogRecordFactory() is factory
    with span("etl"):
        assert await c.submit(current_ids, 1, key="current_ids-1") == (0, 0, False)


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_a_worker_without_the_plugin_runs_tasks_without_a_context(c, s, a):
    with span("etl"):
        assert await c.submit(current_ids, 1, key="current_ids-1") == (0, 0, False)


def fails(x: int) -> int:
    raise KeyError(f"missing {x}")


def sums_through_worker_client(n: int) -> int:
    from distributed import worker_client

    with worker_client() as client:  # (secedes from the thread pool, rejoins)
        return sum(client.gather(client.map(lambda i: i + 1, range(n))))


class Counter:
    def __init__(self) -> None:
        self.n = 0

    def add(self, k: int) -> int:
        self.n += k
        return self.n


@gen_cluster(client=True)
async def test_a_task_error_reaches_the_client_unchanged(c, s, a, b):
    await with_plugin(c)
    with span("etl"):
        with pytest.raises(KeyError, match="missing 3"):
            await c.submit(fails, 3)


@gen_cluster(client=True)
async def test_a_task_can_still_submit_tasks_through_worker_client(c, s, a, b):
    await with_plugin(c)
    with span("etl"):
        assert await c.submit(sums_through_worker_client, 10) == 55


@gen_cluster(client=True)
async def test_actors_still_work(c, s, a, b):
    await with_plugin(c)
    counter = await c.submit(Counter, actor=True)
    assert await counter.add(2) == 2
    assert await counter.add(3) == 5


@gen_cluster(client=True)
async def test_a_setting_that_cannot_work_is_one_error_per_worker_and_tasks_keep_their_context(
        c, s, a, b, caplog):
    with caplog.at_level(logging.ERROR, logger="dask_otel_spans"):
        await c.register_plugin(
            OTelWorkerPlugin(environ={**NO_EXPORT, "OTEL_LOGS_EXPORTER": "bogus"})
        )
    errors = [r.getMessage() for r in caplog.records
              if r.name.startswith("dask_otel_spans") and r.levelno >= logging.ERROR]
    assert len(errors) == 2  # (one per worker)
    assert "OTEL_LOGS_EXPORTER='bogus' is not one of otlp, console, none" in errors[0]
    with span("etl") as span_id:
        got = await c.submit(current_ids, 1, key="current_ids-1")
    assert got[1] == prefix_span_id(span_id, "current_ids")


# -- each signal built on its own (the builder, called directly: nothing installed) --

#: every signal to a place of its own: files for traces and metrics, the console for
#: logs
ALL_SIGNALS = {"OTEL_TRACES_EXPORTER": "otlp_json_file",
               "OTEL_METRICS_EXPORTER": "otlp_json_file",
               "OTEL_LOGS_EXPORTER": "console"}


def build_for_test(environ: dict[str, str], output_dir) -> WorkerProviders:
    """The builder on ``environ``, without the process's global providers."""
    return build_worker_providers("tcp://10.0.0.7:4000", "w-1", environ=environ,
                                  output_dir=str(output_dir), use_global=False)


def package_errors(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name.startswith("dask_otel_spans") and r.levelno >= logging.ERROR]


@pytest.fixture
def shut_down():
    """The providers a test built, shut down after it."""
    built: list[WorkerProviders] = []
    yield built.append
    for providers in built:
        for provider in providers.built:
            provider.shutdown()


def test_a_metrics_exporter_without_its_extra_is_one_error_and_the_other_signals_are_built(
        tmp_path, caplog, monkeypatch, shut_down):
    # (as without the prometheus extra installed)
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.prometheus", None)
    with caplog.at_level(logging.ERROR, logger="dask_otel_spans"):
        p = build_for_test({**ALL_SIGNALS, "OTEL_METRICS_EXPORTER": "prometheus"},
                           tmp_path)
    shut_down(p)
    (error,) = package_errors(caplog)
    assert "OTEL_METRICS_EXPORTER=prometheus needs opentelemetry-exporter-prometheus" in error
    assert p.meter_provider is None and p.metrics_to.startswith("nowhere (")
    assert isinstance(p.tracer_provider, TracerProvider)
    assert p.traces_to.endswith("traces.jsonl")
    assert p.logger_provider is not None and p.logs_to == "the console"


@pytest.mark.parametrize("variable, value, lost", [
    ("OTEL_TRACES_EXPORTER", "zipkin-v9", "tracer_provider"),
    ("OTEL_METRICS_EXPORTER", "bogus", "meter_provider"),
    ("OTEL_LOGS_EXPORTER", "bogus", "logger_provider"),
])
def test_a_signal_whose_value_cannot_work_is_one_error_naming_it_and_the_others_are_built(
        tmp_path, caplog, shut_down, variable, value, lost):
    with caplog.at_level(logging.ERROR, logger="dask_otel_spans"):
        p = build_for_test({**ALL_SIGNALS, variable: value}, tmp_path)
    shut_down(p)
    (error,) = package_errors(caplog)
    assert f"{variable}={value!r} is not one of" in error
    assert error.startswith("dask_otel_spans: worker w-1 (tcp://10.0.0.7:4000) exports no ")
    assert len(p.errors) == 1 and p.errors[0] in error
    built = {"tracer_provider", "meter_provider", "logger_provider"} - {lost}
    assert getattr(p, lost) is None
    assert all(getattr(p, name) in p.built for name in built)


def test_a_workers_export_failure_line_names_the_worker_once(tmp_path, caplog,
                                                             shut_down):
    # (the output directory is a file: the file exporter cannot write)
    (tmp_path / "in-the-way").write_text("")
    p = build_for_test({"OTEL_TRACES_EXPORTER": "otlp_json_file",
                        "OTEL_METRICS_EXPORTER": "none"}, tmp_path / "in-the-way")
    shut_down(p)
    assert p.tracer_provider is not None
    with caplog.at_level(logging.ERROR, logger="dask_otel_spans"):
        p.tracer_provider.get_tracer("test").start_span("lost").end()
        p.tracer_provider.force_flush()
    [line] = [e for e in package_errors(caplog) if "cannot export spans" in e]
    assert line.startswith("dask_otel_spans: worker w-1 (tcp://10.0.0.7:4000): "
                           "cannot export spans to ")
    assert line.count("w-1 (tcp://10.0.0.7:4000)") == 1 and "dropping" in line


@pytest.mark.parametrize("name, label", [("w-1", "worker w-1 (tcp://10.0.0.7:4000)"),
                                         ("tcp://10.0.0.7:4000", "worker tcp://10.0.0.7:4000"),
                                         (None, "worker tcp://10.0.0.7:4000")])
def test_a_worker_is_named_by_its_name_and_address_or_its_address_alone(name, label):
    assert worker_label("tcp://10.0.0.7:4000", name) == label


def test_the_teardown_flush_leaves_pull_readers_alone():
    # (a pull reader queues one collection per flush: the next scrape would repeat
    # every metric family)
    reader = InMemoryMetricReader()
    flushed: list[float] = []
    reader.force_flush = lambda timeout_millis=0: flushed.append(timeout_millis) or True
    provider = MeterProvider(metric_readers=[reader])
    try:
        flush_providers([provider], 1.0)
    finally:
        provider.shutdown()
    assert flushed == []


def test_a_worker_reads_prefix_spans_false_from_its_environment_as_false():
    """``DASK_OTEL_SPANS__PREFIX_SPANS=false`` reaches dask config as the string
    ``"false"``: the worker reads it as the scheduler does (one parser), not as a
    true string."""
    import dask

    from dask_otel_spans.config import setting

    with dask.config.set(dask.config.collect_env(
            {"DASK_OTEL_SPANS__PREFIX_SPANS": "false"})):
        assert setting("prefix-spans") is False

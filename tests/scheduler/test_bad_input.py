"""Hostile or malformed input never raises inside the scheduler: a fallback, one log
line per kind of problem, and the rest of the data still exported."""
from __future__ import annotations

import logging
import time

import dask
import pytest
from distributed import span as dask_span
from distributed.metrics import context_meter
from distributed.utils_test import gen_cluster, gen_test, inc
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from support.plugin import install
from support.polling import async_wait_for
from support.providers import MemoryProviders

from dask_otel_spans import names, span
from dask_otel_spans.protocol.propagation import otel_trace_id


@gen_cluster(client=True)
async def test_otel_annotation_that_is_not_a_mapping(c, s, a, b, caplog):
    memory = MemoryProviders()
    await install(c, memory)
    with caplog.at_level(logging.WARNING, logger="dask_otel_spans"):
        with dask_span("wf"):
            with dask.annotate(otel="garbage"):
                assert await c.submit(inc, 1, key="inc-1") == 2
                assert await c.submit(inc, 2, key="inc-2") == 3
        await async_wait_for(lambda: memory.by_name("wf"))
    assert caplog.text.count("ignoring an 'otel' annotation") == 1


@gen_cluster(client=True)
async def test_truncated_traceparent_falls_back_to_root_uuid(c, s, a, b):
    memory = MemoryProviders()
    await install(c, memory)
    with dask_span("wf") as wf_id:
        with dask.annotate(otel={wf_id: {"traceparent": "00-0af7651916cd43dd84"}}):
            await c.submit(inc, 1, key="inc-1")
        await c.log_event(
            names.EVENT_TOPIC,
            {"ids": [wf_id], "name": ["wf"], "opened": 1, "enter": 0.0, "exit": 1.0,
             "otel": {wf_id: {"traceparent": 12}}},
        )
    await async_wait_for(lambda: memory.by_name("wf"))
    [wf] = memory.by_name("wf")
    assert wf.context.trace_id == otel_trace_id(wf_id)
    assert wf.parent is None


@pytest.mark.parametrize(
    "msg",
    [
        "not a dict",
        {"ids": 5},
        {"ids": ["a"], "name": ["a", "b"], "opened": 1, "enter": 0, "exit": 1},
        {"ids": [1], "name": ["a"], "opened": 1, "enter": 0, "exit": 1},
        {"ids": ["a"], "name": ["a"], "opened": 7, "enter": 0, "exit": 1},
    ],
)
@gen_cluster(client=True)
async def test_malformed_close_notice_is_ignored(c, s, a, b, msg):
    memory = MemoryProviders()
    plugin = await install(c, memory)
    await c.log_event(names.EVENT_TOPIC, msg)
    await plugin.flush()
    assert plugin.forwarder.idle(len(s.workers))
    assert plugin.open_span_count == 0
    assert await c.submit(inc, 1) == 2


@gen_cluster(client=True)
async def test_malformed_notice_in_a_batch_spares_the_others(c, s, a, b):
    memory = MemoryProviders()
    await install(c, memory)
    enter = float(int(time.time()) - 2)
    good = {"ids": ["span-a"], "name": ["a"], "opened": 1, "enter": enter,
            "exit": enter + 1}
    await c.log_event(names.EVENT_TOPIC, ["not a dict", {"ids": 5}, good])
    await async_wait_for(lambda: memory.by_name("a"))
    [sp] = memory.by_name("a")
    assert (sp.start_time, sp.end_time) == (int(enter) * 10**9, (int(enter) + 1) * 10**9)


@gen_cluster(client=True)
async def test_a_close_notice_with_times_that_cannot_be_spares_the_other_spans(
        c, s, a, b, caplog):
    memory = MemoryProviders()
    await install(c, memory)
    now = time.time()

    def notice(name: str, client: str, enter: float, exit_: float) -> dict:
        return {"ids": [f"id-{name}"], "name": [name], "opened": 1, "enter": enter,
                "exit": exit_, "client": client}

    bad = [notice("late", "A", now, 1e15), notice("negative", "A", -5, now),
           notice("nan", "A", float("nan"), now), notice("inf", "A", now, float("inf"))]
    good = [notice(f"good-{i}", "B", now - 2, now - 1) for i in range(3)]
    with caplog.at_level(logging.WARNING, logger="dask_otel_spans"):
        with dask_span("wf"):
            await c.log_event(names.EVENT_TOPIC, [good[0], *bad, good[1]])
            assert await c.submit(inc, 1, key="inc-1") == 2
            await c.log_event(names.EVENT_TOPIC, good[2])
        await async_wait_for(lambda: len(memory.dask_spans()) == 8)
    by_name = {sp.name: sp for sp in memory.dask_spans()}
    for sp in (by_name[f"good-{i}"] for i in range(3)):
        assert (sp.start_time, sp.end_time) == (int(round((now - 2) * 1e9)),
                                                int(round((now - 1) * 1e9)))
    for sp in (by_name[n] for n in ("late", "negative", "nan", "inf")):
        # (the time the scheduler got the notice)
        assert sp.start_time == sp.end_time and now * 1e9 <= sp.end_time <= time.time() * 1e9
    assert caplog.text.count("carry times that cannot be") == 1


@gen_cluster(client=True)
async def test_non_ascii_and_very_long_tags(c, s, a, b):
    memory = MemoryProviders()
    await install(c, memory)
    tag = "données ✓ " * 2000
    with span(tag, "日本語"):
        await c.submit(inc, 1, key="inc-1")
    await async_wait_for(lambda: memory.by_name("日本語"))
    [sp] = memory.by_name("日本語")
    assert sp.attributes[names.SPAN_NAME] == (tag, "日本語")


@gen_cluster(client=True)
async def test_attribute_values_are_cut_to_the_provider_limits(c, s, a, b):
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider(span_limits=SpanLimits(max_attribute_length=64))
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    memory = MemoryProviders()
    memory.tracer_provider = tracer_provider
    memory.span_exporter = exporter
    await install(c, memory)
    with span("x" * 1000):
        await c.submit(inc, 1, key="inc-1")
    await async_wait_for(lambda: memory.dask_spans())
    [sp] = memory.dask_spans()
    assert sp.attributes[names.SPAN_NAME] == ("x" * 64,)


@gen_cluster(client=True, timeout=120)
async def test_a_hundred_levels_of_nesting(c, s, a, b):
    memory = MemoryProviders()
    await install(c, memory)
    ids = []

    def nest(level: int):
        with span(f"level-{level}") as sid:
            ids.append(sid)
            if level < 99:
                return nest(level + 1)
            return c.submit(inc, 1, key="deep")

    await nest(0)
    await async_wait_for(lambda: len(memory.dask_spans()) == 100, timeout=60)
    by_id = {sp.context.span_id: sp for sp in memory.dask_spans()}
    deepest = memory.by_name("level-99")[0]
    depth = 1
    node = deepest
    while node.parent is not None:
        node = by_id[node.parent.span_id]
        depth += 1
    assert depth == 100
    assert node.name == "level-0"


def odd_metrics_task(x):
    context_meter.digest_metric(("not", "a", "string"), 2.0, "furlongs")
    context_meter.digest_metric("fine", 3, "count")
    return x


@gen_cluster(client=True)
async def test_custom_metrics_with_odd_activity_and_unit(c, s, a, b):
    memory = MemoryProviders()
    plugin = await install(c, memory)
    with span("odd") as odd_id:
        assert await c.submit(odd_metrics_task, 1, key="odd-1") == 1
    # (the worker's heartbeat brings the metrics, at whatever time the load allows:
    # the span's grace period may be over before it)
    spans = s.extensions["spans"].spans
    await async_wait_for(lambda: any(
        key[-1] == "furlongs" for key in spans[odd_id].cumulative_worker_metrics))
    await plugin.flush()
    custom = memory.points(names.SPAN_ACTIVITY_CUSTOM)
    assert [(p[1][names.UNIT], p[2]) for p in custom] == [("furlongs", 2.0)]
    assert custom[0][1][names.ACTIVITY] == str(("not", "a", "string"))
    counts = memory.points(names.SPAN_ACTIVITY_COUNT)
    assert any(p[1][names.ACTIVITY] == "fine" and p[2] == 3 for p in counts)


BAD_CONFIGURATION = [
    ({"OTEL_TRACES_EXPORTER": "bogus"}, {}, "OTEL_TRACES_EXPORTER='bogus' is not one "
     "of otlp, console, none, otlp_json_file"),
    ({"OTEL_METRICS_EXPORTER": "statsd"}, {}, "OTEL_METRICS_EXPORTER='statsd' is not "
     "one of otlp, console, prometheus, none, otlp_json_file"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1",
      "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "udp"}, {},
     "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL='udp' is not one of grpc, http/protobuf"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1",
      "OTEL_EXPORTER_OTLP_COMPRESSION": "zip"}, {},
     "OTEL_EXPORTER_OTLP_COMPRESSION='zip' is not one of gzip, deflate, none"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1",
      "OTEL_EXPORTER_OTLP_TIMEOUT": "-5"}, {},
     "OTEL_EXPORTER_OTLP_TIMEOUT='-5' is not a positive number of seconds"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://ann:pa55word@127.0.0.1:1"}, {},
     "OTEL_EXPORTER_OTLP_ENDPOINT='http://ann:***@127.0.0.1:1' has user info, which "
     "OTLP/gRPC cannot send"),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "collector:4318/v1/traces",
      "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, {},
     "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT='collector:4318/v1/traces' is not an http:// "
     "or https:// URL"),
    ({}, {"providers": "no_such_module_xyz:make"},
     "otel-spans.providers='no_such_module_xyz:make' cannot be loaded "
     "(ModuleNotFoundError"),
]


@pytest.mark.parametrize("environ, settings, said", BAD_CONFIGURATION,
                         ids=[said.split("=")[0] for _, _, said in BAD_CONFIGURATION])
@gen_cluster(client=True)
async def test_a_configuration_that_cannot_work_is_one_error_line_and_the_plugin_idles(
    c, s, a, b, caplog, environ, settings, said
):
    from dask_otel_spans import OTelSpansPlugin

    with caplog.at_level(logging.DEBUG, logger="dask_otel_spans"):
        plugin = OTelSpansPlugin(environ=environ, use_global_providers=False,
                                 **settings)
        await c.register_plugin(plugin)
        with span("unexported"):
            assert await c.submit(inc, 1, key="unexported-1") == 2
    [error] = [r for r in caplog.records if r.levelno >= logging.WARNING
               and r.name.startswith("dask_otel_spans")]
    assert error.levelno == logging.ERROR and error.exc_info is None
    assert said in error.getMessage()
    assert "the plugin stays idle: nothing is exported" in error.getMessage()
    assert plugin.transport is None


@gen_cluster(client=True)
async def test_a_negative_duration_is_said_once_and_its_default_used(c, s, a, b, caplog):
    from dask_otel_spans import OTelSpansPlugin

    memory = MemoryProviders()
    with caplog.at_level(logging.WARNING, logger="dask_otel_spans"):
        plugin = OTelSpansPlugin(tracer_provider=memory.tracer_provider,
                                 meter_provider=memory.meter_provider,
                                 export_delay=-2, idle_timeout=1.0)
        await c.register_plugin(plugin)
        with span("still exported"):
            await c.submit(inc, 1, key="still-1")
        await async_wait_for(lambda: memory.by_name("still exported"))
    assert plugin.config.export_delay == 1.0
    [line] = [r.getMessage() for r in caplog.records
              if r.name.startswith("dask_otel_spans")]
    assert "otel-spans.export-delay cannot be -2" in line
    assert "using the default, 1s" in line


@pytest.mark.parametrize("key, value", [("export-delay", "abc"), ("export-delay", "-1s"),
                                        ("max-task-spans", "ten")])
@gen_test()
async def test_a_preloaded_plugin_with_a_bad_setting_runs_on_its_default(
    key, value, tmp_path, caplog
):
    """``dask scheduler --preload dask_otel_spans`` with a bad ``DASK_OTEL_SPANS__*``:
    one ERROR line, and the scheduler has the plugin (distributed's preloading
    would log a traceback and go on without it if the plugin's constructor raised)."""
    from distributed import Scheduler

    from dask_otel_spans import OTelSpansPlugin

    with dask.config.set({f"otel-spans.{key}": value,
                          "otel-spans.output-dir": str(tmp_path),
                          "otel-spans.export-process": False}):
        with caplog.at_level(logging.WARNING):
            async with Scheduler(dashboard_address=":0",
                                 preload=["dask_otel_spans"]) as s:
                plugin = s.plugins.get(names.PLUGIN_NAME)
                assert isinstance(plugin, OTelSpansPlugin)
                assert plugin.transport is not None
    # (the package's own lines: under load asyncio may log an unrelated ERROR)
    [error] = [r.getMessage() for r in caplog.records
               if r.levelno >= logging.ERROR and r.name.startswith("dask_otel_spans")]
    assert error.startswith(f"dask_otel_spans: otel-spans.{key} cannot be {value!r}")
    assert "Failed to start preload" not in caplog.text

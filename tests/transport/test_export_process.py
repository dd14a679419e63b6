"""The export process (``otel-spans.export-process``): the export session in a child
of the scheduler, fed over a pipe; restarts, fallbacks, its budget and shutdown."""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
import time
import urllib.request
import uuid
import warnings

import psutil
import pytest
from distributed import Event
from distributed.utils_test import gen_cluster, inc
from opentelemetry import trace
from support.plugin import FAST, wait_for_event
from support.polling import async_wait_for, wait_for
from support.processes import free_port
from support.providers import MemoryProviders

from dask_otel_spans import OTelSpansPlugin, names, span
from dask_otel_spans.config import PluginConfig
from dask_otel_spans.protocol.figures import ExportFigures
from dask_otel_spans.protocol.wire import Figures
from dask_otel_spans.sdk.otlpjson import latest_points, read_metric_points, read_spans
from dask_otel_spans.transport.sender import ChildSender
from dask_otel_spans.transport.spec import PipelineSpec
from dask_otel_spans.transport.supervisor import EXPORT_PROCESS_NICE, ChildSupervisor


async def install_process_plugin(c, output_dir, **settings) -> OTelSpansPlugin:
    """Register a plugin whose export process writes the embedded default's files."""
    plugin = OTelSpansPlugin(
        export_process=True, use_global_providers=False,
        output_dir=str(output_dir), **{"environ": {}, **FAST, **settings},
    )
    await c.register_plugin(plugin)
    return plugin


def exported_spans(output_dir) -> list[dict]:
    path = os.path.join(str(output_dir), "traces.jsonl")
    return read_spans(path) if os.path.exists(path) else []


def exported_names(output_dir) -> set[str]:
    return {sp["name"] for sp in exported_spans(output_dir)}


async def export_one_span(c, plugin: OTelSpansPlugin, name: str) -> None:
    """Run a one-task span and flush the export process once it was handed over."""
    with span(name):
        await c.submit(inc, 1, key=f"{name}-1")
    await async_wait_for(lambda: plugin.handed_over_count >= 1, timeout=60)
    await plugin.flush()


def child_pid(plugin: OTelSpansPlugin) -> int:
    """The pid of the plugin's export process."""
    assert plugin.destinations["export_process"] is True
    return plugin.destinations["pid"]


@gen_cluster(client=True, timeout=120)
async def test_export_process_exports_spans_and_metrics(c, s, a, b, tmp_path):
    plugin = await install_process_plugin(c, tmp_path)
    assert child_pid(plugin) != os.getpid()
    with span("workflow") as root_id:
        with span("load") as load_id:
            futures = c.map(inc, range(8), key=[f"x-{i}" for i in range(8)])
            assert await c.gather(futures) == list(range(1, 9))
    await async_wait_for(lambda: plugin.ended_count >= 2, timeout=60)
    await plugin.flush()
    points = read_metric_points(str(tmp_path / "metrics.jsonl"))
    await plugin.close()
    spans = {sp["name"]: sp for sp in exported_spans(tmp_path)}
    assert spans["workflow"]["attributes"][names.SPAN_ID] == root_id
    assert spans["load"]["attributes"][names.SPAN_ID] == load_id
    assert spans["load"]["parentSpanId"] == spans["workflow"]["spanId"]
    assert spans["load"]["attributes"][names.SPAN_TASK_COUNT] == 8
    assert spans["workflow"]["attributes"][names.SPAN_TASK_COUNT] == 8
    assert spans["x"]["parentSpanId"] == spans["load"]["spanId"]  # prefix child span
    cpu = [
        p for p in latest_points(points)
        if p["name"] == "dask.span.activity.time"
        and p["attributes"].get(names.SPAN_NAME) == "workflow/load"
        and p["attributes"].get(names.TASK_PREFIX) == "x"
    ]
    assert cpu and sum(p["value"] for p in cpu) > 0


@gen_cluster(
    client=True, timeout=120,
    config={"distributed.diagnostics.computations.nframes": 2},
)
async def test_span_code_reaches_the_export_process_in_a_pickled_batch(
    c, s, a, b, tmp_path
):
    """With ``include-code``, a span's code (distributed's ``SourceCode`` named
    tuples, which marshal cannot take) crosses in a pickled batch and is exported."""
    plugin = await install_process_plugin(
        c, tmp_path, include_code=True, max_code_length=200
    )
    await export_one_span(c, plugin, "coded")
    lost = plugin.export_figures().sender.lost
    await plugin.close()
    [coded] = [
        sp for sp in exported_spans(tmp_path)
        if sp["name"] == "coded" and names.SPAN_ID in sp["attributes"]  # (no prefix)
    ]
    code = coded["attributes"][names.SPAN_CODE]
    assert 0 < len(code) <= 200 and code.startswith("# ")
    assert lost == 0


@gen_cluster(client=True, timeout=120)
async def test_flush_returns_once_the_export_process_exported(c, s, a, b, tmp_path):
    plugin = await install_process_plugin(c, tmp_path)
    await export_one_span(c, plugin, "flushed")
    # no waiting here: flush is a round trip to the export process
    assert "flushed" in exported_names(tmp_path)
    await plugin.close()


@gen_cluster(client=True, timeout=120)
async def test_export_process_reports_its_memory(c, s, a, b, tmp_path):
    plugin = await install_process_plugin(c, tmp_path)
    await export_one_span(c, plugin, "measured")
    figures = plugin.export_figures()
    rss = psutil.Process(child_pid(plugin)).memory_info().rss
    await plugin.close()
    assert figures.ended >= 1
    # the child's own resident set, of the order psutil sees from outside
    assert 0.5 * rss < figures.process.rss_bytes < 2 * rss
    # (tracemalloc off: PYTHONTRACEMALLOC=1 in the scheduler's environment turns it on)
    assert figures.process.traced_bytes is None


def test_a_process_that_traces_its_allocations_reports_them():
    """(In this process: under ``PYTHONTRACEMALLOC=1`` the export process would
    trace its start-up's imports too, seconds of a test.)"""
    import tracemalloc

    from dask_otel_spans.transport.child import process_figures

    tracemalloc.start()
    try:
        kept = [bytes(1000) for _ in range(1000)]  # (a megabyte alive)
        traced = process_figures().traced_bytes
    finally:
        tracemalloc.stop()
    assert len(kept) == 1000 and traced is not None and traced > 10**6


@gen_cluster(client=True, timeout=120)
async def test_export_process_ends_with_the_plugin_and_exports_open_spans(
    c, s, a, b, tmp_path
):
    plugin = await install_process_plugin(c, tmp_path)
    child = psutil.Process(child_pid(plugin))
    with span("still running"):
        fut = c.submit(wait_for_event, "release-sleeper", key="sleeper")
        await async_wait_for(lambda: s.tasks.get("sleeper") is not None
                             and s.tasks["sleeper"].state == "processing")
    await async_wait_for(lambda: plugin.open_span_count >= 1)
    await plugin.close()
    child_running = child.is_running() and child.status() != "zombie"
    await Event("release-sleeper").set()
    del fut
    assert not child_running
    [open_span] = [sp for sp in exported_spans(tmp_path) if sp["name"] == "still running"]
    assert open_span["attributes"][names.SPAN_INCOMPLETE] is True


@gen_cluster(client=True, timeout=120)
async def test_killed_export_process_is_replaced(c, s, a, b, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="dask_otel_spans")
    plugin = await install_process_plugin(c, tmp_path)
    process = plugin.transport.sender
    first = process.supervisor.pid
    with span("before"):
        await c.submit(inc, 1, key="b-1")
    await async_wait_for(lambda: plugin.ended_count >= 1, timeout=60)
    await plugin.flush()
    os.kill(first, signal.SIGKILL)
    # Dead for good: its pipes closed (the reader saw the end). A zombie main
    # thread is not enough: while its other threads exit, the pipe still takes
    # what is written to it, and that is lost with the process.
    await async_wait_for(lambda: f"export process (pid {first}) exited"
                         in caplog.text)
    with span("after"):
        await c.submit(inc, 2, key="a-1")
    await async_wait_for(lambda: process.supervisor.restarts == 1, timeout=60)
    await async_wait_for(lambda: plugin.handed_over_count >= 2, timeout=60)
    await plugin.flush()
    exported = exported_names(tmp_path)
    second = process.supervisor.pid
    emitted = plugin.ended_count
    await plugin.close()
    assert {"before", "after"} <= exported
    assert emitted >= 2  # the dead child's count is kept
    assert second != first
    assert caplog.text.count(f"export process (pid {first}) exited") == 1
    assert "starting a new export process (1 of at most 3" in caplog.text


@gen_cluster(client=True, timeout=120)
async def test_a_span_exported_just_before_the_export_process_died_is_not_exported_again(
    c, s, a, b, tmp_path, caplog
):
    """The scheduler forwards to the next export process the spans past the place
    the one that died said it had read: it said so before it could export them."""
    caplog.set_level(logging.WARNING, logger="dask_otel_spans")
    # (handed over and exported within milliseconds of its last task: well within
    # the half second between two reports of the export process's figures)
    plugin = await install_process_plugin(c, tmp_path, export_delay=0.0,
                                          environ={"OTEL_BSP_SCHEDULE_DELAY": "1"})
    first = child_pid(plugin)
    with span("exported as it dies"):
        await c.submit(inc, 2, key="d-1")
    await async_wait_for(lambda: "exported as it dies" in exported_names(tmp_path),
                         timeout=60)
    os.kill(first, signal.SIGKILL)
    await async_wait_for(lambda: f"export process (pid {first}) exited"
                         in caplog.text)
    with span("after"):  # (a write to a process gone: a new one starts)
        await c.submit(inc, 3, key="a-1")
    await async_wait_for(lambda: "after" in exported_names(tmp_path), timeout=60)
    await plugin.flush()
    exported = [sp["name"] for sp in exported_spans(tmp_path)]
    await plugin.close()
    assert exported.count("exported as it dies") == 1


@gen_cluster(client=True, timeout=120)
async def test_a_span_in_its_grace_period_when_the_export_process_died_is_exported_once(
    c, s, a, b, tmp_path, caplog
):
    caplog.set_level(logging.WARNING, logger="dask_otel_spans")
    # (a grace period of 6 s: the export process's figures, which say it has the span,
    # come every half second, seconds late on a loaded machine; past the grace period
    # it hands the span over, and one handed over and lost with the process is lost)
    plugin = await install_process_plugin(c, tmp_path, export_delay=6.0)
    first = child_pid(plugin)
    with span("in its grace period"):
        await c.submit(inc, 2, key="g-1")
    done = time.monotonic()
    # (it has the span, and hands it over once its grace period is over)
    await async_wait_for(lambda: plugin.export_figures().received >= 1)
    os.kill(first, signal.SIGKILL)
    assert time.monotonic() - done < 5.0  # (killed in the grace period)
    await async_wait_for(lambda: f"export process (pid {first}) exited"
                         in caplog.text)
    with span("after"):  # (a write to a process gone: a new one starts)
        await c.submit(inc, 3, key="a-1")
    await async_wait_for(lambda: {"in its grace period", "after"}
                         <= exported_names(tmp_path), timeout=60)
    await plugin.flush()
    exported = [sp["name"] for sp in exported_spans(tmp_path)]
    await plugin.close()
    assert exported.count("in its grace period") == 1


@gen_cluster(client=True, timeout=120)
async def test_spans_sent_to_an_export_process_as_it_dies_are_sent_again(
    c, s, a, b, tmp_path, caplog
):
    """What the dying process's pipe took (it was stopped, then killed) is lost with
    it; the new process gets those spans from the scheduler again, and the contexts
    their graphs carried (the trace of the client's span)."""
    caplog.set_level(logging.WARNING, logger="dask_otel_spans")
    plugin = await install_process_plugin(c, tmp_path)
    process = plugin.transport.sender
    await export_one_span(c, plugin, "before")
    first = process.supervisor.pid
    os.kill(first, signal.SIGSTOP)  # it reads no more
    client_span = trace.NonRecordingSpan(trace.SpanContext(
        0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, is_remote=True,
        trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED)))
    with trace.use_span(client_span), span("into the pipe"):
        held = c.submit(inc, 2, key="p-1")  # (the scheduler holds its annotations)
        await held
    # forwarded and written (or, if the kill comes first, failed and sent again)
    await async_wait_for(lambda: plugin.forwarder.forwarded.spans >= 2
                         and process.waiting == 0)
    os.kill(first, signal.SIGKILL)
    await async_wait_for(lambda: f"export process (pid {first}) exited"
                         in caplog.text)
    with span("after"):  # (a write to a process gone: a new one starts)
        await c.submit(inc, 3, key="a-1")
    await async_wait_for(lambda: plugin.handed_over_count >= 3, timeout=60)
    await plugin.flush()
    exported = {sp["name"]: sp for sp in exported_spans(tmp_path)}
    await plugin.close()
    assert {"before", "into the pipe", "after"} <= set(exported)
    assert exported["into the pipe"]["traceId"] == "0af7651916cd43dd8448eb211c80319c"
    assert exported["into the pipe"]["parentSpanId"] == "b7ad6b7169203331"
    del held


def test_the_export_process_figures_thread_carries_on_after_an_error(monkeypatch):
    from dask_otel_spans.transport import child as export_child

    class Session:
        calls = 0

        def figures(self) -> ExportFigures:
            self.calls += 1
            if self.calls == 1:
                raise RuntimeError("figures not ready")
            return ExportFigures(open=1)

    class Outbox:
        def __init__(self) -> None:
            self.sent: list = []

        def send_with_figures(self, answer, session) -> None:
            self.sent.append(answer(session.figures()))

    monkeypatch.setattr(export_child, "_FIGURES_INTERVAL", 0.01)
    outbox, stopped = Outbox(), threading.Event()
    thread = threading.Thread(
        target=export_child.report_figures, args=(Session(), outbox, stopped),
        daemon=True,
    )
    thread.start()
    try:
        wait_for(lambda: outbox.sent, timeout=10)
    finally:
        stopped.set()
        thread.join(5)
    assert isinstance(outbox.sent[0], Figures) and outbox.sent[0].figures.open == 1


@gen_cluster(client=True, timeout=120)
async def test_export_process_that_cannot_start_leaves_export_in_the_scheduler(
    c, s, a, b, tmp_path, monkeypatch, caplog
):
    caplog.set_level(logging.ERROR, logger="dask_otel_spans")
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-such-python"))
    plugin = await install_process_plugin(c, tmp_path)
    assert plugin.destinations["export_process"] is False
    with span("in the scheduler"):
        await c.submit(inc, 1, key="i-1")
    await async_wait_for(lambda: plugin.ended_count >= 1, timeout=60)
    await plugin.close()
    assert "the export process did not start" in caplog.text
    assert "in the scheduler" in exported_names(tmp_path)


@gen_cluster(client=True)
async def test_given_providers_keep_export_in_the_scheduler(c, s, a, b):
    memory = MemoryProviders()
    plugin = OTelSpansPlugin(
        tracer_provider=memory.tracer_provider, meter_provider=memory.meter_provider,
        export_process=True, **FAST,
    )
    await c.register_plugin(plugin)
    assert plugin.destinations["export_process"] is False
    with span("given"):
        await c.submit(inc, 1, key="g-1")
    await async_wait_for(lambda: memory.by_name("given"), timeout=30)
    await plugin.close()
    memory.shutdown()


@gen_cluster(client=True, timeout=120)
async def test_a_providers_factory_that_fails_in_the_export_process_is_one_error_line(
    c, s, a, b, tmp_path, caplog
):
    """It loads (the scheduler's check passes) but raises when the export process
    calls it: one line, no traceback, no second try in the scheduler process."""
    caplog.set_level(logging.WARNING, logger="dask_otel_spans")
    plugin = await install_process_plugin(
        c, tmp_path, providers="support.providers:failing_providers"
    )
    assert plugin.transport is None  # (idle)
    with span("unexported"):
        assert await c.submit(inc, 1, key="u-1") == 2
    await plugin.close()
    [error] = [r for r in caplog.records if r.levelno >= logging.WARNING
               and r.name.startswith("dask_otel_spans")]
    assert error.exc_info is None
    assert "cannot set up exporters (RuntimeError: no collector credentials)" in (
        error.getMessage()
    )
    assert "the plugin stays idle: nothing is exported" in error.getMessage()


def test_messages_past_the_budget_are_dropped_counted_and_said_once(caplog):
    process = ChildSender(ChildSupervisor(PipelineSpec(PluginConfig.from_dask_config()),
                                          nice=10, cpu_policy="idle"), budget=5)
    # (no sender thread: everything sent waits)
    with caplog.at_level(logging.WARNING, logger="dask_otel_spans"):
        process.send([("workers", 1)] * 4)
        process.send([("span", ("a",), ("a",), 0.0, 0, 0), ("deltas", {})])
        process.send([("deltas", {})] * 3)
    assert process.waiting == 4
    assert process.figures().sender.dropped_by_kind == {"span": 1, "deltas": 4}
    [warning] = [r.getMessage() for r in caplog.records]
    assert "5 messages wait" not in warning and "4 messages wait" in warning
    assert "otel-spans.forward-budget, now 5" in warning and "CPU policy idle" in warning


@pytest.mark.cluster  # (an export process)
def test_flush_after_the_export_process_is_gone_for_good_returns_false(tmp_path):
    supervisor = ChildSupervisor(
        PipelineSpec(PluginConfig.from_dask_config(output_dir=str(tmp_path)), environ={}),
        max_restarts=0,
    )
    supervisor.launch()
    pid = supervisor.pid
    process = ChildSender(supervisor)
    process.start()
    try:
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not supervisor.child_running)
        process.send([("worker-deltas", {("gather-dep", "seconds"): 1.0})])
        assert process.flush(10) is False
        # (the reader's end of the pipe can fail the flush before the sender
        # counted the item it could not send)
        wait_for(lambda: process.lost >= 1, timeout=10)
    finally:
        process.stop(5)


@gen_cluster(client=True)
async def test_prometheus_on_the_scheduler_port_keeps_export_in_the_scheduler(c, s, a, b):
    plugin = OTelSpansPlugin(
        export_process=True, use_global_providers=False,
        environ={"OTEL_METRICS_EXPORTER": "prometheus", "OTEL_TRACES_EXPORTER": "none"},
        **FAST,
    )
    await c.register_plugin(plugin)
    # the scheduler's own /metrics is this process's registry: no child could fill it
    assert plugin.destinations["export_process"] is False
    await plugin.close()


@gen_cluster(client=True, timeout=120)
async def test_prometheus_on_a_port_of_its_own_is_served_by_the_export_process(
    c, s, a, b
):
    port = free_port()
    plugin = OTelSpansPlugin(
        export_process=True, use_global_providers=False,
        environ={"OTEL_METRICS_EXPORTER": "prometheus", "OTEL_TRACES_EXPORTER": "none",
                 "OTEL_EXPORTER_PROMETHEUS_PORT": str(port),
                 "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1"},
        **FAST,
    )
    await c.register_plugin(plugin)
    child = child_pid(plugin)
    with span("scraped"):
        await c.submit(inc, 1, key="p-1")
    await async_wait_for(lambda: plugin.handed_over_count >= 1, timeout=60)
    await plugin.flush()
    scrape = await asyncio.get_running_loop().run_in_executor(
        None, lambda: wait_for(lambda: _scrape_with(port, 'dask_span_name="scraped"'))
    )
    listener = [
        conn.pid for conn in psutil.net_connections("tcp")
        if conn.laddr and conn.laddr.port == port and conn.status == "LISTEN"
    ]
    await plugin.close()
    assert "dask_span_duration_seconds_count" in scrape
    assert listener in ([child], [None])  # pid hidden without root


def _scrape_with(port: int, needle: str) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None
    return text if needle in text else None


def notice(name: str, **extra) -> tuple:
    """The close notice of a one-level block that sent no task."""
    now = time.time()
    msg = {"ids": [str(uuid.uuid4())], "name": [name], "opened": 1, "enter": now - 1,
           "exit": now, **extra}
    return ("notice", now, msg)


@pytest.fixture
def file_export_process(tmp_path):
    """An export process writing OTLP-JSON files to ``tmp_path``, started."""
    supervisor = ChildSupervisor(
        PipelineSpec(PluginConfig.from_dask_config(output_dir=str(tmp_path)), environ={})
    )
    supervisor.launch()
    process = ChildSender(supervisor)
    process.start()
    yield process
    process.stop(10)


@pytest.mark.cluster  # (an export process)
def test_a_message_that_cannot_be_pickled_is_left_out_alone(
    file_export_process, tmp_path, caplog
):
    process = file_export_process
    with caplog.at_level(logging.ERROR, logger="dask_otel_spans"):
        process.send([
            notice("good"), notice("bad", odd=lambda: None), notice("also good"),
        ])
        assert process.flush(30) is True
    process.stop(10)  # (the spans still open are emitted as it ends)
    assert process.lost == 1
    assert caplog.text.count("cannot send an item (notice)") == 1
    assert exported_names(tmp_path) == {"good", "also good"}


@gen_cluster(client=True, timeout=120)
async def test_by_default_providers_from_configuration_export_in_a_child(
    c, s, a, b, tmp_path
):
    # no export_process setting: the shipped default, auto
    plugin = OTelSpansPlugin(environ={}, use_global_providers=False,
                             output_dir=str(tmp_path), **FAST)
    await c.register_plugin(plugin)
    assert plugin.destinations["export_process"]
    await export_one_span(c, plugin, "by-default")
    await plugin.close()
    assert "by-default" in exported_names(tmp_path)


@gen_cluster(client=True)
async def test_by_default_given_providers_export_in_the_scheduler_quietly(
    c, s, a, b, caplog
):
    memory = MemoryProviders()
    with caplog.at_level(logging.INFO, logger="dask_otel_spans"):
        plugin = OTelSpansPlugin(tracer_provider=memory.tracer_provider,
                                 meter_provider=memory.meter_provider, **FAST)
        await c.register_plugin(plugin)
    assert plugin.destinations["export_process"] is False
    # auto asks for nothing: where export stays is not worth an INFO line
    assert "traces to" in caplog.text  # INFO lines were captured
    assert "export process" not in caplog.text
    await plugin.close()
    memory.shutdown()


@gen_cluster(client=True)
async def test_export_process_false_exports_in_the_scheduler(c, s, a, b, tmp_path):
    plugin = OTelSpansPlugin(environ={}, use_global_providers=False,
                             output_dir=str(tmp_path), export_process=False, **FAST)
    await c.register_plugin(plugin)
    assert plugin.destinations["export_process"] is False
    await export_one_span(c, plugin, "here")
    await plugin.close()
    assert "here" in exported_names(tmp_path)


@gen_cluster(client=True, timeout=120)
async def test_registered_again_with_the_same_settings_keeps_its_export_process(
    c, s, a, b, tmp_path
):
    first = await install_process_plugin(c, tmp_path)
    child = first.transport.sender
    with span("parent"):
        with span("child"):
            await c.submit(inc, 1, key="child-1")
        # the child span is emitted (its summary is in the export process) while
        # its parent is still open
        await async_wait_for(lambda: first.handed_over_count >= 1, timeout=60)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # distributed: "overwriting"
            second = await install_process_plugin(c, tmp_path)
        await c.submit(inc, 2, key="parent-1")
    await async_wait_for(lambda: second.handed_over_count >= 1, timeout=60)
    await second.flush()
    assert second.transport.sender is child and first.transport is None
    assert child.supervisor.pid is not None and psutil.pid_exists(child.supervisor.pid)
    await second.close()
    spans = {sp["name"]: sp for sp in exported_spans(tmp_path)}
    # the parent's subtree totals count the child emitted before the hand-over
    assert spans["parent"]["attributes"][names.SPAN_TASK_COUNT] == 2
    assert spans["child"]["attributes"][names.SPAN_TASK_COUNT] == 1


@gen_cluster(client=True, timeout=120)
async def test_registered_again_with_other_settings_starts_a_new_export_process(
    c, s, a, b, tmp_path
):
    first = child_pid(await install_process_plugin(c, tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        second_plugin = await install_process_plugin(c, tmp_path, export_delay=0.2)
    second = child_pid(second_plugin)
    await export_one_span(c, second_plugin, "after")
    await second_plugin.close()
    assert second not in (None, first)
    # the first instance stopped its own at its close
    assert not psutil.pid_exists(first) or (
        psutil.Process(first).status() == psutil.STATUS_ZOMBIE
    )
    assert "after" in exported_names(tmp_path)


def thread_nice_levels(pid: int) -> set[int]:
    """Nice level of each thread of a process (Linux keeps it per thread)."""
    levels = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        levels.add(int(fields[16]))  # field 19 of stat: nice
    return levels


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

@gen_cluster(client=True, timeout=120)
async def test_export_process_runs_its_nice_levels_below_the_scheduler(
    c, s, a, b, tmp_path
):
    # (the configured default, not the tests' FAST policy)
    default = PluginConfig.from_dask_config().export_process_cpu_policy
    plugin = await install_process_plugin(c, tmp_path, export_process_cpu_policy=default)
    await export_one_span(c, plugin, "niced")  # the SDK's threads run by now
    pid = child_pid(plugin)
    levels = thread_nice_levels(pid)
    policy = os.sched_getscheduler(pid)
    await plugin.close()
    assert levels == {
        min(19, os.getpriority(os.PRIO_PROCESS, 0) + EXPORT_PROCESS_NICE)
    }
    # by default it runs on CPU time nothing else wants
    assert policy == os.SCHED_IDLE


@pytest.mark.cluster  # (an export process)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("nice, policy, expected", [
    (5, "batch", "SCHED_BATCH"),
    (0, "idle", "SCHED_IDLE"),  # (the policy applies without nice levels too)
])
def test_export_process_cpu_policy_sets_its_scheduling_policy(
    tmp_path, nice, policy, expected
):
    process = ChildSupervisor(
        PipelineSpec(PluginConfig.from_dask_config(output_dir=str(tmp_path)), environ={}),
        nice=nice, cpu_policy=policy,
    )
    process.launch()
    try:
        assert os.sched_getscheduler(process.pid) == getattr(os, expected)
        assert thread_nice_levels(process.pid) == {
            min(19, os.getpriority(os.PRIO_PROCESS, 0) + nice)
        }
    finally:
        process.stop(5)


@pytest.mark.cluster  # (an export process)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_export_process_nice_0_keeps_the_scheduler_priority(tmp_path):
    process = ChildSupervisor(
        PipelineSpec(PluginConfig.from_dask_config(output_dir=str(tmp_path)), environ={}), nice=0
    )
    process.launch()
    try:
        assert thread_nice_levels(process.pid) == {os.getpriority(os.PRIO_PROCESS, 0)}
        assert os.sched_getscheduler(process.pid) == os.sched_getscheduler(0)
    finally:
        process.stop(5)


@pytest.mark.cluster  # (an export process)
def test_export_process_leaves_its_setup_out_of_garbage_collections(tmp_path):
    from dask_otel_spans.transport.child import YOUNG_GC_THRESHOLD

    supervisor = ChildSupervisor(
        PipelineSpec(PluginConfig.from_dask_config(output_dir=str(tmp_path)), environ={})
    )
    supervisor.launch()
    process = ChildSender(supervisor)
    process.start()
    try:
        assert process.flush(30)
        figures = process.figures().process
        # the containers of the SDK's, distributed's and the package's modules
        # (about 70,000 with Python 3.11)
        assert figures.gc_frozen_objects > 10_000
        assert figures.gc_young_threshold == YOUNG_GC_THRESHOLD
        assert figures.gc_collections[2] >= 1  # the one collection before freezing
    finally:
        process.stop(5)


def run_while_stopped(c, plugin, n: int):
    """Run ``n`` one-task spans while the export process is stopped (SIGSTOP), then
    let it go on; their names."""
    names_ = [f"stopped-{i}" for i in range(n)]

    async def run() -> None:
        pid = child_pid(plugin)
        os.kill(pid, signal.SIGSTOP)
        try:
            for i, name in enumerate(names_):
                with span(name):  # (a task group of its own: "stopped<i>")
                    await c.submit(inc, i, key=f"stopped{i}-1")
            # (their spans, groups and graphs forwarded, waiting in the scheduler)
            await async_wait_for(lambda: plugin.forwarder.forwarded.spans >= n)
        finally:
            os.kill(pid, signal.SIGCONT)

    return names_, run()


@gen_cluster(client=True, timeout=120)
async def test_a_stopped_export_process_loses_nothing_within_the_budget(
    c, s, a, b, tmp_path
):
    plugin = await install_process_plugin(c, tmp_path)
    stopped, running = run_while_stopped(c, plugin, 120)
    await running
    await async_wait_for(lambda: plugin.handed_over_count >= 120, timeout=60)
    await plugin.flush()
    dropped = plugin.export_figures().sender.dropped_by_kind
    await plugin.close()
    assert set(stopped) <= exported_names(tmp_path)
    assert dropped == {}


@gen_cluster(client=True, timeout=120)
async def test_an_export_process_stopped_then_killed_as_it_exports_makes_each_span_once(
    c, s, a, b, tmp_path, caplog
):
    caplog.set_level(logging.WARNING, logger="dask_otel_spans")
    plugin = await install_process_plugin(c, tmp_path,
                                          environ={"OTEL_BSP_SCHEDULE_DELAY": "1"})
    first = child_pid(plugin)
    stopped, running = run_while_stopped(c, plugin, 10)
    await running
    # killed once it went on and exported some of them, not all
    await async_wait_for(lambda: exported_names(tmp_path) & set(stopped), timeout=60)
    os.kill(first, signal.SIGKILL)
    await async_wait_for(lambda: f"export process (pid {first}) exited"
                         in caplog.text)
    await export_one_span(c, plugin, "after")  # (a new export process)
    await async_wait_for(lambda: {*stopped, "after"} <= exported_names(tmp_path),
                         timeout=60)
    await plugin.flush()
    exported = [sp["name"] for sp in exported_spans(tmp_path)]
    await plugin.close()
    assert sorted(name for name in exported if name in stopped) == sorted(stopped)


@gen_cluster(client=True, timeout=120)
async def test_past_the_budget_a_stopped_export_process_drops_the_newest_and_says_so(
    c, s, a, b, tmp_path, caplog
):
    caplog.set_level(logging.WARNING, logger="dask_otel_spans")
    plugin = await install_process_plugin(c, tmp_path, forward_budget=100)
    stopped, running = run_while_stopped(c, plugin, 150)
    await running
    # the backlog drains: what was kept arrives, then new spans flow again
    await async_wait_for(lambda: plugin.transport.sender.waiting == 0)
    await export_one_span(c, plugin, "after")
    await async_wait_for(lambda: "after" in exported_names(tmp_path), timeout=60)
    dropped = plugin.export_figures().sender.dropped_by_kind
    await plugin.close()
    exported = exported_names(tmp_path)
    kept = [name for name in stopped if name in exported]
    assert 0 < len(kept) < 150 and "after" in exported
    assert dropped.get("span", 0) >= 150 - len(kept)
    assert caplog.text.count("otel-spans.forward-budget, now 100") == 1
    assert caplog.text.count("the export process caught up") == 1

"""The in-process plugin says once when exporting takes a noticeable share of the
scheduler process's CPU (``ExportShareWatch``), and not when the export process
could not help."""
from __future__ import annotations

import logging

import pytest
from distributed.utils_test import gen_cluster, inc
from support.plugin import FAST
from support.polling import async_wait_for
from support.providers import MemoryProviders

from dask_otel_spans import OTelSpansPlugin, span
from dask_otel_spans.export.share import ExportShareWatch


class Clocks:
    """Hand-driven clocks: wall seconds, the export threads' and the process's CPU."""

    def __init__(self):
        self.now = 0.0
        self.export = 0.0
        self.process = 0.0

    def advance(self, seconds: float, process_cpu: float, export_cpu: float) -> None:
        self.now += seconds
        self.process += process_cpu
        self.export += export_cpu


@pytest.fixture
def clocks() -> Clocks:
    return Clocks()


@pytest.fixture
def watch(clocks) -> ExportShareWatch:
    return ExportShareWatch(
        lambda: clocks.export, process_cpu=lambda: clocks.process,
        clock=lambda: clocks.now, window=60.0, share_threshold=0.05,
        busy_threshold=0.25,
    )


def test_a_busy_window_with_a_large_export_share_is_reported_once(watch, clocks):
    assert watch.check() is None  # starts the first window
    clocks.advance(60.0, process_cpu=30.0, export_cpu=3.0)
    share, window = watch.check()
    assert share == pytest.approx(0.1)
    assert window == pytest.approx(60.0)
    clocks.advance(60.0, process_cpu=30.0, export_cpu=3.0)
    assert watch.check() is None


def test_nothing_is_reported_before_a_window_ends(watch, clocks):
    watch.check()
    clocks.advance(59.0, process_cpu=30.0, export_cpu=10.0)
    assert watch.check() is None


def test_an_idle_scheduler_is_not_reported_whatever_the_share(watch, clocks):
    watch.check()
    clocks.advance(60.0, process_cpu=1.0, export_cpu=0.5)  # 50 % of almost nothing
    assert watch.check() is None


def test_a_small_share_is_not_reported_and_the_next_window_starts(watch, clocks):
    watch.check()
    clocks.advance(60.0, process_cpu=30.0, export_cpu=0.6)  # 2 %
    assert watch.check() is None
    # the next window is measured on its own, not together with the quiet one
    clocks.advance(60.0, process_cpu=30.0, export_cpu=3.0)
    share, _ = watch.check()
    assert share == pytest.approx(0.1)


def configured_plugin(tmp_path, **settings) -> OTelSpansPlugin:
    """A plugin building its providers from configuration (the embedded default)."""
    return OTelSpansPlugin(environ={}, use_global_providers=False,
                           output_dir=str(tmp_path), **{**FAST, **settings})


@gen_cluster(client=True)
async def test_the_plugin_says_once_that_the_export_process_would_help(
    c, s, a, b, tmp_path, caplog
):
    with caplog.at_level(logging.INFO, logger="dask_otel_spans"):
        plugin = configured_plugin(tmp_path, export_process=False)
        await c.register_plugin(plugin)
        session = plugin.transport.session
        assert session.share_watch is not None
        # every window of 0.2 s counts (the real one: 5 % of a busy minute)
        session.share_watch = ExportShareWatch(
            session.pipeline.cpu_seconds, window=0.2, share_threshold=0.0,
            busy_threshold=0.0,
        )
        for i in range(3):
            with span(f"work-{i}"):
                await c.submit(inc, i, key=f"w-{i}")
        await async_wait_for(lambda: plugin.ended_count >= 3, timeout=30)
        await async_wait_for(lambda: session.share_watch.reported, timeout=30)
        await plugin.close()
    advice = [r for r in caplog.records
              if "export-process: auto (the default) moves" in r.getMessage()]
    assert len(advice) == 1
    assert "of its CPU over the last" in advice[0].getMessage()


@gen_cluster(client=True)
async def test_no_advice_with_given_providers(c, s, a, b):
    # providers of this process cannot move to an export process
    memory = MemoryProviders()
    plugin = OTelSpansPlugin(tracer_provider=memory.tracer_provider,
                             meter_provider=memory.meter_provider)
    await c.register_plugin(plugin)
    assert plugin.destinations["export_process"] is False
    assert plugin.transport.session.share_watch is None
    await plugin.close()


@gen_cluster(client=True, timeout=120)
async def test_no_advice_with_the_export_process_of_the_default(c, s, a, b, tmp_path):
    plugin = configured_plugin(tmp_path)
    await c.register_plugin(plugin)
    assert plugin.destinations["export_process"] is True
    assert not hasattr(plugin.transport, "session")
    await plugin.close()

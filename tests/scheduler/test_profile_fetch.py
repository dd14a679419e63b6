"""Dask's statistical profiles of a span's task prefixes, fetched from the workers
(``profile.enabled``) and put on the prefix spans, on in-process clusters exporting
to memory (the workers' profiler samples their threads every 5 ms, in cycles of
100 ms)."""
from __future__ import annotations

import json
import os
import uuid
from types import SimpleNamespace

from distributed import Event, wait
from distributed.utils_test import gen_cluster
from support.plugin import install, plugin_of
from support.polling import async_wait_for
from support.providers import MemoryProviders
from support.workloads import hot_loop

from dask_otel_spans import OTelSpansPlugin, names, span
from dask_otel_spans.config import PluginConfig
from dask_otel_spans.protocol import events
from dask_otel_spans.protocol.profiles import profile_file
from dask_otel_spans.scheduler.profiles import ProfileFetcher
from dask_otel_spans.sdk.otlpjson import TRACES_FILE, read_spans

#: the workers sample often and cycle fast, so a task of a second is many samples
FAST_PROFILER = {"distributed.worker.profile.enabled": True,
                 "distributed.worker.profile.interval": "5ms",
                 "distributed.worker.profile.cycle": "100ms"}
PROFILED = dict(profile_enabled=True, profile_min_seconds=0.2, profile_timeout=5.0)


def quick(x: int) -> int:
    return x


@gen_cluster(client=True, config=FAST_PROFILER)
async def test_a_done_prefix_span_waits_for_its_profile_and_names_its_hot_function(
        c, s, a, b):
    memory = MemoryProviders()
    await install(c, memory, **PROFILED)
    with span("burn"):
        await wait(c.map(hot_loop, [0.6, 0.6]))
    await memory.first("burn")
    attributes = memory.prefix_span("hot_loop").attributes
    assert attributes[names.PROFILE_SAMPLES] >= 10
    top = attributes[names.PROFILE_TOP]
    assert top[0].startswith(
        f"hot_loop (workloads.py:{hot_loop.__code__.co_firstlineno}) ")
    assert names.PROFILE_SHARED_SPANS not in attributes
    assert names.PROFILE_MISSING not in attributes
    assert plugin_of(s)._profiles.fetches == 1


@gen_cluster(client=True, config=FAST_PROFILER)
async def test_a_prefix_with_less_task_time_than_min_seconds_is_not_profiled(
        c, s, a, b):
    memory = MemoryProviders()
    await install(c, memory, **PROFILED)
    with span("small"):
        await wait(c.map(quick, range(4)))
    await memory.first("small")
    assert names.PROFILE_SAMPLES not in memory.prefix_span("quick").attributes
    assert plugin_of(s)._profiles.fetches == 0


@gen_cluster(client=True, config=FAST_PROFILER)
async def test_profiles_are_on_by_default(c, s, a, b):
    memory = MemoryProviders()
    await install(c, memory, profile_min_seconds=0.2)
    with span("burn"):
        await wait(c.submit(hot_loop, 0.4))
    await memory.first("burn")
    assert memory.prefix_span("hot_loop").attributes[names.PROFILE_SAMPLES] > 0


@gen_cluster(client=True, config=FAST_PROFILER)
async def test_profile_false_turns_them_off(c, s, a, b):
    memory = MemoryProviders()
    await install(c, memory, profile_enabled=False, profile_min_seconds=0.2)
    with span("burn"):
        await wait(c.submit(hot_loop, 0.4))
    await memory.first("burn")
    assert names.PROFILE_SAMPLES not in memory.prefix_span("hot_loop").attributes
    assert plugin_of(s)._profiles is None


@gen_cluster(client=True, config=FAST_PROFILER)
async def test_other_spans_running_the_prefix_meanwhile_are_counted(c, s, a, b):
    memory = MemoryProviders()
    await install(c, memory, **PROFILED)
    # (two task groups of one prefix: keys with tokens of their own)
    with span("one"):
        first = c.submit(hot_loop, 0.6, key=(f"hot_loop-{uuid.uuid4().hex}", 0))
    with span("two"):
        second = c.submit(hot_loop, 0.6, key=(f"hot_loop-{uuid.uuid4().hex}", 0))
    await wait([first, second])
    await memory.first("one")
    await memory.first("two")
    for prefix_span in memory.by_name("hot_loop"):
        assert prefix_span.attributes[names.PROFILE_SHARED_SPANS] == 1


def burn_first(seconds: float) -> int:
    return hot_loop(seconds)


def burn_then(previous: int, seconds: float) -> int:
    return previous + hot_loop(seconds)


@gen_cluster(client=True, config=FAST_PROFILER)
async def test_a_span_over_is_one_coroutine_for_all_its_prefixes(c, s, a, b):
    memory = MemoryProviders()
    await install(c, memory, **PROFILED)
    # (burn_then waits for burn_first: the span is over once, when both are done)
    with span("phases"):
        first = c.submit(burn_first, 0.4)
        await wait([c.submit(burn_then, first, 0.4), c.submit(hot_loop, 0.4)])
    await memory.first("phases")
    fetcher = plugin_of(s)._profiles
    assert fetcher.coroutines == 1
    assert fetcher.fetches == 3
    for prefix in ("burn_first", "burn_then", "hot_loop"):
        assert memory.prefix_span(prefix).attributes[names.PROFILE_SAMPLES] > 0


def burn_until_set(event_name: str) -> int:
    """Burn CPU until the distributed Event ``event_name`` is set."""
    event = Event(event_name)
    n = 0
    while not event.is_set():
        n += hot_loop(0.05)
    return n


@gen_cluster(client=True, nthreads=[("", 2)], config=FAST_PROFILER)
async def test_a_running_span_is_one_coroutine_a_window_for_its_running_prefixes(
        c, s, a):
    memory = MemoryProviders()
    await install(c, memory, **PROFILED, profile_window=0.3)
    fetcher = plugin_of(s)._profiles
    release = Event(f"release-{uuid.uuid4().hex}")
    with span("long"):
        burns = [c.submit(burn_until_set, release.name, key=f"{prefix}-1")
                 for prefix in ("burn_a", "burn_b")]
        # (windows while both prefixes run, whatever the load: the first may hold
        # one of them, seen running before the other)
        await async_wait_for(lambda: fetcher.coroutines >= 3, timeout=30)
        await release.set()
        await wait(burns)
    await memory.first("long")
    assert fetcher.fetches > fetcher.coroutines  # (both prefixes in a coroutine)
    assert fetcher.fetches <= 2 * fetcher.coroutines


#: the workers keep 40 cycles of 100 ms: 4 s of history (a margin for a window's
#: fetch delayed on a loaded machine; the spans below are longer)
HISTORY_40 = {**FAST_PROFILER, "distributed.admin.low-level-log-length": 40}


@gen_cluster(client=True, nthreads=[("", 1)], config=HISTORY_40)
async def test_a_prefix_done_while_its_span_runs_on_is_fetched_before_it_ages_out(
        c, s, a):
    memory = MemoryProviders()
    await install(c, memory, **PROFILED, profile_window=0.7)
    # (burn_first is over long before the span, and older than the workers' history
    # by then; a second of it: the workers' sampler, a callback of the event loop
    # this process's hot loops hold the GIL from, gets too few turns in less on a
    # loaded machine)
    with span("phases"):
        first = c.submit(burn_first, 1.0)
        await wait(c.submit(burn_then, first, 5.0))
    await memory.first("phases")
    attributes = memory.prefix_span("burn_first").attributes
    assert attributes[names.PROFILE_SAMPLES] > 0
    assert attributes[names.PROFILE_TOP][0].startswith("hot_loop (")


@gen_cluster(client=True, nthreads=[("", 1)], config=HISTORY_40)
async def test_a_span_longer_than_the_history_says_what_it_could_not_get(c, s, a):
    memory = MemoryProviders()
    await install(c, memory, **PROFILED)
    # (fetched once the span is over: its first half second is past the 4 s of
    # history by then, and its end still in it however late the load makes the
    # fetch, within reason; with half a second of history, a fetch later than that
    # found nothing left)
    with span("long"):
        await wait(c.submit(hot_loop, 4.5))
    await memory.first("long")
    attributes = memory.prefix_span("hot_loop").attributes
    assert "no longer in the workers' history" in attributes[names.PROFILE_MISSING]
    assert attributes[names.PROFILE_TOP][0].startswith("hot_loop (")


@gen_cluster(client=True, nthreads=[("", 1)], config=HISTORY_40)
async def test_a_running_span_fetched_by_windows_keeps_its_early_part(c, s, a):
    memory = MemoryProviders()
    await install(c, memory, **PROFILED, profile_window=0.2)
    # (a window spans up to two ticks and is asked for a moment later, the hot loop
    # in this process holding the GIL: well within the 4 s of history; the span is
    # longer)
    with span("long"):
        await wait(c.submit(hot_loop, 5.0))
    await memory.first("long")
    attributes = memory.prefix_span("hot_loop").attributes
    assert plugin_of(s)._profiles.fetches >= 3
    assert names.PROFILE_MISSING not in attributes
    assert attributes[names.PROFILE_TOP][0].startswith("hot_loop (")


@gen_cluster(client=True, config=FAST_PROFILER)
async def test_each_dask_span_gets_a_speedscope_file_beside_the_traces_by_its_ids(
        c, s, a, b, tmp_path):
    await c.register_plugin(OTelSpansPlugin(
        environ={}, use_global_providers=False, output_dir=str(tmp_path),
        export_process=False, export_delay=0.1, idle_timeout=1.0, **PROFILED))
    with span("burn"):
        await wait(c.submit(hot_loop, 0.6))
    traces = tmp_path / TRACES_FILE

    def spans():
        return read_spans(str(traces)) if traces.exists() else []

    await async_wait_for(lambda: any(sp["name"] == "burn" for sp in spans()))
    (burn,) = [sp for sp in spans() if sp["name"] == "burn"]
    (prefix,) = [sp for sp in spans() if sp["name"] == "hot_loop"]
    path = profile_file(str(tmp_path), int(burn["traceId"], 16), int(burn["spanId"], 16))
    await async_wait_for(lambda: os.path.exists(path))
    with open(path) as f:
        doc = json.load(f)
    (profile,) = doc["profiles"]
    assert profile["name"] == "hot_loop (burn)"
    assert sum(profile["weights"]) == prefix["attributes"][names.PROFILE_SAMPLES]
    frames = doc["shared"]["frames"]
    heaviest = max(zip(profile["samples"], profile["weights"], strict=True),
                   key=lambda e: e[1])[0]
    # (its leaf: hot_loop, alone or beside a sibling leaf it cannot be told from,
    # as distributed 2024.1's task wrapper has one: 'hot_loop | meter')
    assert "hot_loop" in frames[heaviest[-1]]["name"].split(" | ")


class CountingExtensions(dict):
    """A scheduler's extensions that count how often the spans extension is read."""

    reads = 0

    def get(self, name, default=None):
        self.reads += 1
        return default


def test_the_tap_reads_a_spans_groups_only_when_a_prefix_worth_a_profile_stops():
    extensions = CountingExtensions()
    fetcher = ProfileFetcher(SimpleNamespace(extensions=extensions), SimpleNamespace(),
                             PluginConfig.from_dask_config(profile_enabled=True))

    def done(group: int, prefix: str, duration: float):
        return events.group_done("s", group, (prefix, 0.0, 1.0, 8, duration, 1, 0))

    fetcher.tap([events.group_running("s", 1, "f"), events.group_running("s", 2, "f")])
    fetcher.tap([done(1, "f", 5.0), done(3, "g", 0.1)])
    assert extensions.reads == 0  # f still runs; g has too little task time
    fetcher.tap([done(2, "f", 0.1)])
    assert extensions.reads == 1

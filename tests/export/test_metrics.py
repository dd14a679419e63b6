"""Pure tests of the instruments: unit families, attributes, cardinality cap."""
from __future__ import annotations

import pytest
from support.polling import wait_for

from dask_otel_spans import names
from dask_otel_spans.export.caps import SeriesCap, SpanNameCap
from dask_otel_spans.export.metrics import (
    SPAN_DURATION_BUCKETS,
    DaskInstruments,
    MetricsPump,
    unit_family,
)
from dask_otel_spans.sdk.providers import SDK_DEFAULT_CARDINALITY_LIMIT

SID = "0eadd631-e68b-495e-b072-7765d0d61002"


@pytest.fixture
def instruments(memory):
    meter = memory.meter_provider.get_meter("test")
    return DaskInstruments(meter, SpanNameCap(depth=None, max_names=3))


@pytest.mark.parametrize(
    "unit, family",
    [
        ("seconds", ("time", "s")),
        ("bytes", ("data", "By")),
        ("count", ("count", "{event}")),
        ("rows", ("custom", "1")),
        (None, ("custom", "1")),
        (3, ("custom", "1")),
    ],
)
def test_unit_families(unit, family):
    assert unit_family(unit) == family


def test_span_deltas_go_to_the_instrument_of_their_unit(memory, instruments):
    instruments.add_span_deltas(
        {
            ("execute", SID, "read", "thread-cpu", "seconds"): 1.5,
            ("execute", SID, "read", "disk-read", "bytes"): 100,
            ("execute", SID, "read", "memory-read", "count"): 3,
            ("execute", SID, "read", "scored", "rows"): 7,
        },
        {SID: ("wf", "load")},
    )
    instruments.send()
    assert memory.points(names.SPAN_ACTIVITY_TIME) == [
        (
            names.SPAN_ACTIVITY_TIME,
            {
                names.SPAN_NAME: "wf/load",
                names.CONTEXT: "execute",
                names.TASK_PREFIX: "read",
                names.ACTIVITY: "thread-cpu",
                names.UNIT: "seconds",
            },
            1.5,
        )
    ]
    assert memory.points(names.SPAN_ACTIVITY_DATA)[0][2] == 100
    assert memory.points(names.SPAN_ACTIVITY_COUNT)[0][2] == 3
    custom = memory.points(names.SPAN_ACTIVITY_CUSTOM)[0]
    assert (custom[1][names.UNIT], custom[2]) == ("rows", 7)


def test_deltas_accumulate(memory, instruments):
    key = ("execute", SID, "read", "thread-cpu", "seconds")
    instruments.add_span_deltas({key: 1.0}, {SID: ("wf",)})
    instruments.send()
    instruments.add_span_deltas({key: 2.0}, {SID: ("wf",)})
    instruments.send()
    assert memory.points(names.SPAN_ACTIVITY_TIME)[0][2] == pytest.approx(3.0)


def test_heartbeats_of_one_series_reach_the_sdk_as_one_call(memory, instruments):
    key = ("execute", SID, "read", "thread-cpu", "seconds")
    for _ in range(10):  # e.g. ten workers' heartbeats between two sends
        instruments.add_span_deltas({key: 0.5}, {SID: ("wf",)})
    instruments.send()
    assert (instruments.updates, instruments.sdk_calls) == (10, 1)
    assert memory.points(names.SPAN_ACTIVITY_TIME)[0][2] == pytest.approx(5.0)


def test_spans_past_the_name_cap_share_one_sdk_call(memory, instruments):
    # the fixture's cap is 3 names: spans 3 to 9 all land in __other__
    ids = [f"span-{i}" for i in range(10)]
    instruments.add_span_deltas(
        {("execute", i, "read", "thread-cpu", "seconds"): 1.0 for i in ids},
        {i: (i,) for i in ids},
    )
    instruments.send()
    assert instruments.sdk_calls == 4
    other = [p for p in memory.points(names.SPAN_ACTIVITY_TIME)
             if p[1][names.SPAN_NAME] == names.OTHER_SPAN_NAME]
    assert [p[2] for p in other] == [pytest.approx(7.0)]


def test_nothing_reaches_the_sdk_before_send(memory, instruments):
    instruments.add_worker_deltas({("gather-dep", "network", "seconds"): 0.5})
    assert memory.points(names.WORKER_ACTIVITY_TIME) == []
    assert instruments.has_unsent


def test_malformed_deltas_are_skipped(memory, instruments):
    instruments.add_span_deltas(
        {
            "latency": 1.0,
            ("execute",): 1.0,
            ("execute", SID, "read", "thread-cpu", "seconds"): "x",
            ("execute", SID, "read", "thread-cpu", "seconds", "extra"): -1,
            ("execute", SID, "read", 42, "seconds"): 2.0,
        },
        {},
    )
    instruments.send()
    points = memory.points(names.SPAN_ACTIVITY_TIME)
    assert [(p[1][names.ACTIVITY], p[2]) for p in points] == [("42", 2.0)]


def test_worker_deltas_have_no_span(memory, instruments):
    instruments.add_worker_deltas({("gather-dep", "network", "seconds"): 0.5})
    instruments.send()
    [(name, attrs, value)] = memory.points(names.WORKER_ACTIVITY_TIME)
    assert attrs == {
        names.CONTEXT: "gather-dep",
        names.ACTIVITY: "network",
        names.UNIT: "seconds",
    }
    assert value == 0.5


def test_span_name_cap_folds_into_other():
    cap = SpanNameCap(depth=None, max_names=2)
    assert cap(("a",)) == "a"
    assert cap(("b", "c")) == "b/c"
    assert cap(("d",)) == names.OTHER_SPAN_NAME
    assert cap(("a",)) == "a"
    assert cap.overflowed


def test_span_names_stay_the_same_when_asked_again_lists_and_unhashable_tags_included():
    cap = SpanNameCap(depth=2, max_names=1)
    assert [cap(("etl", "load", "x")) for _ in range(3)] == ["etl/load"] * 3
    assert cap(["etl", "load"]) == "etl/load"
    assert [cap(("other",)) for _ in range(2)] == [names.OTHER_SPAN_NAME] * 2
    assert cap((["unhashable"], "load")) == names.OTHER_SPAN_NAME


def test_span_name_depth():
    cap = SpanNameCap(depth=1, max_names=10)
    assert cap(("tenant-a", "load", "parse")) == "tenant-a"


def test_span_name_is_cut_to_max_length():
    cap = SpanNameCap(depth=None, max_names=10, max_length=8)
    assert cap(("é" * 20, "x")) == "é" * 8
    # cut names that collide count once against max_names
    assert cap(("é" * 30,)) == "é" * 8
    assert not cap.overflowed


def test_emitted_span_records_duration_idle_and_active(memory, instruments):
    instruments.span_opened(("wf",))
    instruments.send()
    instruments.span_ended(("wf",), 2.5, 0.75, True)
    instruments.send()
    [(_, attrs, total)] = memory.points(names.SPAN_DURATION)
    assert total == 2.5
    [(_, _, active)] = memory.points(names.SPAN_ACTIVE)
    assert active == 0
    [(_, idle_attrs, idle)] = memory.points(names.SPAN_ACTIVITY_TIME)
    assert idle_attrs[names.ACTIVITY] == names.IDLE_ACTIVITY
    assert idle_attrs[names.TASK_PREFIX] == names.IDLE_PREFIX
    assert idle == 0.75


def test_pump_records_on_its_thread_and_flushes(memory, instruments):
    pump = MetricsPump(instruments, max_queue_size=100)
    pump.start()
    try:
        pump.submit(DaskInstruments.add_worker_deltas, {("get-data", "network", "seconds"): 1.0})
        assert pump.flush(5)
        assert memory.points(names.WORKER_ACTIVITY_TIME)[0][2] == 1.0
    finally:
        pump.stop()
    assert not pump.thread.running


class CountingPump(MetricsPump):
    """A pump that counts the queue operations it is handed updates in."""

    handed: list[int]

    def submit_many(self, calls):
        self.handed.append(len(calls))
        super().submit_many(calls)


def test_spans_emitted_together_reach_the_pump_in_one_queue_operation(memory, instruments):
    from dask_otel_spans.export.ender import HandOver, SpanEnder
    from dask_otel_spans.export.writers import span_writer

    pump = CountingPump(instruments, max_queue_size=100)
    pump.handed = []
    ender = SpanEnder(span_writer(memory.tracer_provider, owned=False), pump)
    pump.start()
    ender.start()
    try:
        ender.end_many([
            HandOver((f"step-{i}",), (f"id-{i}",), {}, None, 10.0, True, "closed",
                        enter=8.0, exit=10.0)
            for i in range(5)])
        assert ender.flush(5) and pump.flush(5)
    finally:
        ender.stop()
        pump.stop()
    assert pump.handed == [5]
    # every span's duration recorded (2 s each; past the name cap of 3, under one name)
    assert sum(total for _, _, total in memory.points(names.SPAN_DURATION)) == 10.0


def test_pump_sends_the_sums_when_its_interval_runs_out(memory, instruments):
    pump = MetricsPump(instruments, max_queue_size=100, send_interval=1.0)
    pump.start()
    try:
        for _ in range(3):
            pump.submit(DaskInstruments.add_worker_deltas,
                        {("get-data", "network", "seconds"): 1.0})
        # no flush: the thread wakes up for the sums still unsent
        wait_for(lambda: memory.points(names.WORKER_ACTIVITY_TIME)
                 and memory.points(names.WORKER_ACTIVITY_TIME)[0][2] == 3.0, timeout=10)
        assert instruments.sdk_calls <= 2  # the first update at once, then the rest
    finally:
        pump.stop()


def test_pump_drops_and_counts_when_full(instruments):
    pump = MetricsPump(instruments, max_queue_size=2)  # not started: nothing drains
    for _ in range(5):
        pump.submit(DaskInstruments.add_worker_deltas, {})
    assert pump.dropped == 3


ACTIVITIES = ["thread-cpu", "thread-noncpu", "executor", "other", "deserialize", "serialize"]


def _one_second_per_activity(instruments, spans: int) -> None:
    """``spans`` distinct span names, each with one second of every activity."""
    for i in range(spans):
        sid = f"span-{i}"
        instruments.add_span_deltas(
            {("execute", sid, "inc", a, "seconds"): 1.0 for a in ACTIVITIES},
            {sid: (f"workflow-{i}",)},
        )
    instruments.send()


def test_default_series_cap_keeps_every_series_out_of_the_sdk_overflow(memory):
    # 400 names x 6 activities = 2,400 series: past the SDK's default limit (2,000),
    # which would put 400 of them in an anonymous otel.metric.overflow point
    meter = memory.meter_provider.get_meter("test")
    instruments = DaskInstruments(meter, SpanNameCap(depth=None, max_names=1000))
    _one_second_per_activity(instruments, 400)
    points = memory.points(names.SPAN_ACTIVITY_TIME)
    assert len(points) <= SDK_DEFAULT_CARDINALITY_LIMIT
    assert not [p for p in points if "otel.metric.overflow" in p[1]]
    for activity in ACTIVITIES:
        total = sum(v for _, a, v in points if a[names.ACTIVITY] == activity)
        assert total == pytest.approx(400.0)


def test_series_past_the_cap_keep_context_activity_and_unit(memory):
    meter = memory.meter_provider.get_meter("test")
    instruments = DaskInstruments(
        meter, SpanNameCap(depth=None, max_names=1000), SeriesCap(max_series=100)
    )
    _one_second_per_activity(instruments, 30)  # 180 series wanted
    points = memory.points(names.SPAN_ACTIVITY_TIME)
    assert len(points) <= 100
    other = [a for _, a, _ in points if a[names.SPAN_NAME] == names.OTHER_SPAN_NAME]
    assert {a[names.ACTIVITY] for a in other} == set(ACTIVITIES)
    assert {a[names.TASK_PREFIX] for a in other} == {names.OTHER_SPAN_NAME}
    assert {a[names.UNIT] for a in other} == {"seconds"}
    assert sum(v for _, _, v in points) == pytest.approx(180.0)


def test_series_cap_never_creates_more_than_its_limit(memory):
    # a cap too small for even one __other__ form per activity: the rest lands in
    # one set whose every attribute is __other__
    meter = memory.meter_provider.get_meter("test")
    instruments = DaskInstruments(
        meter, SpanNameCap(depth=None, max_names=1000), SeriesCap(max_series=5)
    )
    _one_second_per_activity(instruments, 10)
    points = memory.points(names.SPAN_ACTIVITY_TIME)
    assert len(points) == 5
    everything_else = [
        v for _, a, v in points if set(a.values()) == {names.OTHER_SPAN_NAME}
    ]
    assert everything_else == [pytest.approx(60.0 - 4)]


def test_series_cap_also_bounds_the_span_duration_histogram(memory):
    meter = memory.meter_provider.get_meter("test")
    instruments = DaskInstruments(
        meter, SpanNameCap(depth=None, max_names=1000), SeriesCap(max_series=10)
    )
    for i in range(50):
        instruments.span_ended((f"workflow-{i}",), 1.0, 0.0, False)
    points = memory.points(names.SPAN_DURATION)
    assert len(points) <= 10
    assert sum(v for _, _, v in points) == pytest.approx(50.0)


def test_series_cap_is_logged_once_per_instrument(memory, caplog):
    meter = memory.meter_provider.get_meter("test")
    instruments = DaskInstruments(
        meter, SpanNameCap(depth=None, max_names=1000), SeriesCap(max_series=20)
    )
    with caplog.at_level("WARNING", logger="dask_otel_spans.export.metrics"):
        _one_second_per_activity(instruments, 10)
        _one_second_per_activity(instruments, 20)
    logged = [r for r in caplog.records if "max-series" in r.getMessage()]
    assert len(logged) == 1
    assert names.SPAN_ACTIVITY_TIME in logged[0].getMessage()


def test_span_duration_buckets_suit_seconds(memory, instruments):
    # 0.3 s, 0.4 s, 45 s and 2 h: the SDK's default boundaries (meant for ms) would
    # put the first three in one bucket (0, 5]
    for duration in (0.3, 0.4, 45.0, 7200.0):
        instruments.span_ended(("wf",), duration, 0.0, False)
    data = memory.metric_reader.get_metrics_data()
    [point] = [
        dp
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == names.SPAN_DURATION
        for dp in m.data.data_points
    ]
    assert tuple(point.explicit_bounds) == SPAN_DURATION_BUCKETS
    counts = dict(zip((*SPAN_DURATION_BUCKETS, float("inf")), point.bucket_counts,
                      strict=True))
    assert counts[0.5] == 2  # (0.25, 0.5]
    assert counts[60.0] == 1  # (30, 60]
    assert counts[7200.0] == 1  # (3600, 7200]
    assert sum(point.bucket_counts) == 4


def test_series_cap_of_none_admits_every_series():
    cap = SeriesCap(max_series=None)
    instrument = object()
    for i in range(3000):
        attrs = {names.SPAN_NAME: f"workflow-{i}"}
        assert cap(instrument, attrs) is attrs

"""Close notices, which any client sends with anything in them, through the readiness
tracker: times that cannot be are ignored (the span takes the notice's arrival), the
spans notices open before the scheduler saw them are bounded per client and in all, a
span takes its first close notice; each said once per client, never per notice."""
from __future__ import annotations

import logging

import pytest

from dask_otel_spans.config import PluginConfig
from dask_otel_spans.export.tracking.notices import NoticeGate
from dask_otel_spans.export.tracking.readiness import ReadinessTracker
from dask_otel_spans.export.tracking.tree import SpanTree

CONFIG = PluginConfig.from_dask_config(export_delay=0.1, idle_timeout=5.0,
                                       lazy_timeout=60.0)
T0 = 1_800_000_000.0


class Notices:
    """A tracker fed close notices only (spans the scheduler never saw)."""

    def __init__(self) -> None:
        tree = SpanTree([])
        self.tracker = ReadinessTracker(tree.spans, tree.chain_of, CONFIG,
                                        on_handed_over=tree.forget)
        self.tracker.notices = NoticeGate(per_client=3, total=5)

    def close(self, span_id: str, client: str | None, at: float = T0,
              enter: float | None = None, exit_: float | None = None) -> None:
        self.tracker.close_notice(at, {
            "ids": [span_id], "name": [span_id], "opened": 1, "client": client,
            "enter": at - 1 if enter is None else enter,
            "exit": at if exit_ is None else exit_})

    def handed_over(self, now: float) -> dict[str, tuple[float | None, float | None]]:
        """The spans a pass at ``now`` hands over: their enter and exit times."""
        self.tracker.run_pass(now)
        return {r.ids[-1]: (r.enter, r.exit) for r in self.tracker.take()[1]}


@pytest.fixture
def notices() -> Notices:
    return Notices()


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


@pytest.mark.parametrize("enter, exit_", [
    (T0 - 1, 1e15), (-5.0, T0), (float("nan"), T0), (T0 - 1, float("inf"))],
    ids=["1e15", "-5", "nan", "inf"])
def test_times_that_cannot_be_are_ignored_and_the_span_is_kept(notices, enter, exit_):
    notices.close("bad", "client-a", at=T0, enter=enter, exit_=exit_)
    notices.close("good", "client-b", at=T0)
    assert notices.handed_over(T0 + 10) == {"bad": (T0, T0), "good": (T0 - 1, T0)}


def test_times_that_cannot_be_are_said_once_per_client(notices, caplog):
    with caplog.at_level(logging.WARNING, logger="dask_otel_spans"):
        for i in range(2):
            notices.close(f"a{i}", "client-a", enter=-5)
            notices.close(f"b{i}", "client-b", exit_=1e15)
    said = warnings_of(caplog)
    assert len(said) == 2
    assert "client 'client-a'" in said[0] and "client 'client-b'" in said[1]
    assert all("times that cannot be" in line for line in said)


def test_spans_opened_by_notices_are_bounded_per_client(notices, caplog):
    with caplog.at_level(logging.WARNING, logger="dask_otel_spans"):
        for i in range(10):
            notices.close(f"a{i}", "client-a")
        notices.close("b0", "client-b")
    assert notices.tracker.open_count == 4  # (3 of client-a, past the bound: ignored)
    [said] = warnings_of(caplog)
    assert "client 'client-a'" in said and "3 per client" in said
    assert set(notices.handed_over(T0 + 10)) == {"a0", "a1", "a2", "b0"}
    notices.close("a-later", "client-a", at=T0 + 11)  # (handed over: counted no more)
    assert notices.tracker.open_count == 1


def test_spans_opened_by_notices_are_bounded_in_all(notices):
    for client in ("a", "b", "c"):
        for i in range(3):
            notices.close(f"{client}{i}", client)
    assert notices.tracker.open_count == 5
    assert notices.tracker.notices.ignored == 4


def test_a_span_takes_its_first_close_notice(notices, caplog):
    notices.close("s", "client-a", at=T0)
    with caplog.at_level(logging.WARNING, logger="dask_otel_spans"):
        for i in range(1, 4):  # (each would push its hand-over later)
            notices.close("s", "client-a", at=T0 + 4 * i, enter=T0 + 4 * i - 1)
    assert notices.handed_over(T0 + 5.5) == {"s": (T0 - 1, T0)}
    [said] = warnings_of(caplog)
    assert "another close notice for spans closed already" in said


def test_spans_that_wait_for_their_client_alone_are_counted_until_seen(notices):
    notices.close("a0", "client-a")
    notices.close("a1", "client-a")
    notices.close("b0", "client-b")
    notices.close("x0", None)
    gate = notices.tracker.notices
    assert gate.waiting_on_clients() == (4, {"client-a": 2, "client-b": 1})
    gate.seen("a0")  # (a task of it came)
    assert gate.waiting_on_clients() == (3, {"client-a": 1, "client-b": 1})
    notices.handed_over(T0 + 10)
    assert gate.waiting_on_clients() == (0, {}) and gate.open_count == 0


def test_spans_opened_by_notices_are_bounded_over_time_per_client(notices):
    notices.tracker.notices = NoticeGate(per_client=3, total=100, per_second=0.1)
    for i in range(3):
        notices.close(f"a{i}", "client-a", at=T0)
    assert set(notices.handed_over(T0 + 10)) == {"a0", "a1", "a2"}
    for i in range(3, 6):  # (none open: one more after 10 s at 0.1 a second)
        notices.close(f"a{i}", "client-a", at=T0 + 10)
    notices.close("b0", "client-b", at=T0 + 10)
    assert notices.tracker.open_count == 2
    assert set(notices.handed_over(T0 + 20)) == {"a3", "b0"}

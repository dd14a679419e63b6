"""The export side's figures: typed records that cross the pipe, add up over export
processes, and read in words."""
from __future__ import annotations

import io

from dask_otel_spans.protocol.figures import (
    ExportFigures,
    ProcessFigures,
    SenderFigures,
    SignalFigures,
)
from dask_otel_spans.protocol.outcome import describe, settled
from dask_otel_spans.protocol.wire import Figures, read_frame, write_frame

FIGURES = ExportFigures(
    received=10, handed_over=8, ended=7, open=2, last_position=9,
    waiting_on_clients=2, waiting_on_client={"client-a": 1},
    signals={"traces": SignalFigures(delivered=5, failed=0, held=1, spooled=2,
                                     dropped=0),
             "metrics": SignalFigures()},
    spool_directory="/tmp/spool",
    process=ProcessFigures(pid=7, cpu_s=1.5, gc_collections=(3, 2, 1)),
    sender=SenderFigures(lost=1, frames=4, dropped_by_kind={"deltas": 2}),
)


def test_figures_cross_the_pipe_whole():
    pipe = io.BytesIO()
    write_frame(pipe, Figures(FIGURES))
    pipe.seek(0)
    assert read_frame(pipe) == Figures(FIGURES)


def test_only_the_cumulative_counts_add_those_of_ended_processes():
    earlier = {"received": 100, "handed_over": 90, "ended": 80, "open": 5}
    total = FIGURES.plus_counts(earlier)
    assert (total.received, total.handed_over, total.ended) == (110, 98, 87)
    assert total.open == 2 and total.last_position == 9


def test_a_client_waits_for_the_open_spans_but_those_of_other_clients_alone():
    assert FIGURES.open_for(None) == 2
    assert FIGURES.open_for("client-a") == 1  # (its own, not the unnamed client's)
    assert FIGURES.open_for("client-b") == 0


def test_flat_figures_keep_the_names_benchmarks_read():
    flat = FIGURES.flat()
    assert flat["traces_delivered"] == 5 and flat["traces_spooled"] == 2
    assert flat["metrics_delivered"] is None
    assert flat["process_cpu_s"] == 1.5 and flat["gc_collections_2"] == 1
    assert flat["lost"] == 1 and flat["dropped_by_kind"] == {"deltas": 2}
    assert flat["ended"] == 7


def test_a_signal_not_counted_says_so():
    assert describe(SignalFigures(), "metrics", "Prometheus").startswith(
        "metrics to Prometheus (not counted: ")


def test_a_signal_sent_nowhere_says_only_that():
    where = "nowhere (OTEL_TRACES_EXPORTER=none)"
    assert describe(SignalFigures(), "traces", where) == f"traces to {where}"


def test_held_and_spooled_items_are_said_with_the_spool_directory():
    text = describe(FIGURES.signal("traces"), "traces", "the collector",
                    handed=10, spool_directory="/tmp/spool")
    assert text.startswith("traces to the collector: 5 spans delivered, 0 failed")
    assert "1 still held in memory" in text
    assert "2 still held in the spool /tmp/spool" in text
    assert "dask-otel-spans resend /tmp/spool" in text
    assert "2 not attempted" in text
    assert not settled(FIGURES.signal("traces"))
    assert settled(SignalFigures(delivered=3, failed=0, held=0, spooled=0, dropped=0))


def test_at_close_past_the_timeout_the_spooled_are_held_and_the_rest_lost():
    # 10 handed: 5 delivered, 2 in the spool, 1 left in memory, 2 never exported
    text = describe(FIGURES.signal("traces"), "traces", "the collector", handed=10,
                    spool_directory="/tmp/spool", at_close=True, timed_out=3.0)
    assert "2 still held in the spool /tmp/spool" in text
    assert "1 lost (held in memory only)" in text
    assert "2 lost (not exported within the 3.0 s of otel-spans.shutdown-timeout)" in text
    assert "still held in memory" not in text and "not attempted" not in text


def test_at_close_what_is_all_held_in_the_spool_is_not_said_lost():
    figures = SignalFigures(delivered=5, failed=0, held=0, spooled=2, dropped=0)
    text = describe(figures, "traces", "the collector", handed=7,
                    spool_directory="/tmp/spool", at_close=True, timed_out=3.0)
    assert "2 still held in the spool /tmp/spool" in text and "lost" not in text


def test_at_close_past_the_timeout_an_uncounted_remainder_is_said_lost_once():
    figures = SignalFigures(delivered=40, failed=0)
    text = describe(figures, "metrics", "the collector", at_close=True, timed_out=3.0)
    assert text == ("metrics to the collector: 40 metric points delivered, 0 failed, "
                    "what its exporters had not exported within the 3.0 s of "
                    "otel-spans.shutdown-timeout is lost")


def test_resend_does_not_suggest_itself_for_what_is_left():
    text = describe(FIGURES.signal("traces"), "traces", "the collector",
                    spool_directory="/tmp/spool", resending=True)
    assert "2 still held in the spool /tmp/spool" in text
    assert "resend" not in text and "next export process" not in text


def test_one_item_delivered_is_said_in_the_singular():
    text = describe(SignalFigures(delivered=1, failed=0), "metrics", "the collector")
    assert text == "metrics to the collector: 1 metric point delivered, 0 failed"


def test_items_sent_again_after_no_answer_are_said():
    figures = SignalFigures(delivered=6, failed=0, held=0, spooled=0, dropped=0,
                            resent=4)
    text = describe(figures, "traces", "the collector")
    assert text.endswith("4 sent again after an attempt got no answer in time (the "
                         "backend may have them twice)")
    assert settled(figures)  # (nothing is left: resending is not an outcome left over)

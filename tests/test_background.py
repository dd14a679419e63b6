"""The engine thread (``QueueThread``): batches are one queue operation, their items
handled one by one; due work runs when its wait runs out and before a flush ends."""
from __future__ import annotations

import pytest

from dask_otel_spans.background import QueueThread


class Recording:
    """A handler that records what it is given; ``"fails"`` raises."""

    def __init__(self) -> None:
        self.handled: list = []
        self.due = 0

    def handle(self, item):
        if item == "fails":
            raise ValueError(item)
        self.handled.append(item)

    def run_due(self):
        self.due += 1


@pytest.fixture
def recording():
    return Recording()


def test_items_put_together_are_handled_one_by_one_in_order(recording):
    q = QueueThread("test-queue", recording.handle)
    q.start()
    try:
        q.put("first")
        q.put_many(["a", "fails", "b"])
        q.put("last")
        assert q.flush(10)
    finally:
        q.stop(10)
    assert recording.handled == ["first", "a", "b", "last"]  # a failing item stops no other


def test_items_put_together_into_a_full_queue_are_each_counted_as_dropped(recording):
    q = QueueThread("test-queue", recording.handle, maxsize=1)  # not started: stays full
    assert q.put("fills it")
    assert not q.put_many(["a", "b", "c"])
    assert not q.put("d")
    assert q.dropped == 4


def test_an_empty_batch_takes_no_place_in_the_queue(recording):
    q = QueueThread("test-queue", recording.handle, maxsize=1)
    assert q.put_many([])
    assert q.put("still fits")  # (the empty batch took no place)


def test_due_work_runs_before_a_flush_ends(recording):
    q = QueueThread("test-queue", recording.handle, due=recording.run_due)
    q.start()
    try:
        q.put("item")
        assert q.flush(10)
        assert recording.due == 1 and recording.handled == ["item"]
    finally:
        q.stop(10)

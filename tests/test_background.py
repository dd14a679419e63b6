"""The background queue's batches: one queue operation, items handled one by one."""
from __future__ import annotations

from dask_otel_spans.background import BackgroundQueue


class Recording(BackgroundQueue):
    def __init__(self, maxsize: int = 0):
        super().__init__("test-queue", maxsize, "items")
        self.handled: list = []

    def handle(self, item):
        if item == "fails":
            raise ValueError(item)
        self.handled.append(item)


def test_items_put_together_are_handled_one_by_one_in_order():
    q = Recording()
    q.start()
    try:
        q.put("first")
        q.put_many(["a", "fails", "b"])
        q.put("last")
        assert q.flush(10)
    finally:
        q.stop(10)
    assert q.handled == ["first", "a", "b", "last"]  # a failing item stops no other


def test_items_put_together_into_a_full_queue_are_each_counted_as_dropped():
    q = Recording(maxsize=1)  # not started: the queue stays full
    assert q.put("fills it")
    assert not q.put_many(["a", "b", "c"])
    assert not q.put("d")
    assert q.dropped == 4


def test_an_empty_batch_takes_no_place_in_the_queue():
    q = Recording(maxsize=1)
    assert q.put_many([])
    assert q.put("still fits")  # (the empty batch took no place)

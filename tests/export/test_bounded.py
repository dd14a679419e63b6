"""The bounded memory the export session's id sets, warnings and traces use."""
from __future__ import annotations

from dask_otel_spans.export.bounded import BoundedMemory


def test_a_bounded_memory_forgets_its_oldest_entries_past_its_limit():
    memory = BoundedMemory(3)
    for key in "abcde":
        memory.remember(key, key.upper())
    assert list(memory.items()) == [("c", "C"), ("d", "D"), ("e", "E")]


def test_remembering_a_key_again_keeps_it_longest():
    memory = BoundedMemory(2)
    memory.remember("a")
    memory.remember("b")
    memory.remember("a")
    memory.remember("c")
    assert list(memory) == ["a", "c"]

"""Counted nouns: singular for one, plural otherwise (a count as a file has it too)."""
from __future__ import annotations

import pytest

from dask_otel_spans.wording import counted


@pytest.mark.parametrize("n, said", [(0, "0 tasks"), (1, "1 task"), (2, "2 tasks"),
                                     ("1", "1 task"), (1.5, "1.5 tasks")])
def test_one_thing_is_singular_others_plural(n, said):
    assert counted(n, "task") == said


def test_an_irregular_plural_is_given():
    assert (counted(1, "batch", "batches"), counted(2, "batch", "batches")) == (
        "1 batch", "2 batches")

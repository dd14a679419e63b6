"""The places of the spans the export processes handed over, kept as runs."""
from __future__ import annotations

import random

from dask_otel_spans.transport.places import Places, runs


def test_places_are_said_as_runs_of_consecutive_places():
    assert runs([7, 3, 4, 5, 9, 4]) == ((3, 5), (7, 7), (9, 9))
    assert runs([]) == ()


def test_a_set_of_runs_holds_exactly_the_places_added():
    rng = random.Random(1)
    added: set[int] = set()
    places = Places()
    for _ in range(300):
        first = rng.randrange(200)
        last = first + rng.randrange(4)
        places.add(first, last)
        added.update(range(first, last + 1))
    assert {p for p in range(-5, 210) if p in places} == added
    # (touching and overlapping runs merged: one run per stretch)
    assert places.runs == len(runs(added))


def test_places_handed_over_in_order_are_one_run():
    places = Places()
    places.add_runs(runs(range(0, 500, 2)))
    places.add_runs(runs(range(1, 500, 2)))
    assert places.runs == 1 and 499 in places and 500 not in places

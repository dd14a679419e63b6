"""The memory part's verdict: flat is growth with the spans emitted, not a ratio of
a few KiB."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
from bench_scheduler import memory_growth  # noqa: E402


def test_a_few_kib_over_many_spans_is_flat_whatever_the_ratio():
    line = memory_growth({"emitted": 16_000, "plugin_bytes": 5_000},
                         {"emitted": 198_000, "plugin_bytes": 7_500},
                         "plugin_bytes", "here")
    assert "+0.014 bytes per span" in line
    assert line.endswith(": yes")


def test_one_small_object_per_span_is_growth():
    line = memory_growth({"emitted": 10_000, "plugin_bytes": 2_000_000},
                         {"emitted": 100_000, "plugin_bytes": 2_000_000 + 90_000 * 28},
                         "plugin_bytes", "here")
    assert "+28.000 bytes per span" in line
    assert line.endswith(": NO")


def test_within_ten_percent_is_flat():
    line = memory_growth({"emitted": 10_000, "plugin_bytes": 2_000_000},
                         {"emitted": 11_000, "plugin_bytes": 2_150_000},
                         "plugin_bytes", "here")
    assert line.endswith(": yes")

"""The export process benchmark records a real scheduler's frames and replays them
into the export process's loop."""
from __future__ import annotations

import pickle
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
from bench_child import FIGURES, load_stream, record_tree, replay_tree  # noqa: E402

TREE = str(Path(__file__).parent.parent)


@pytest.fixture(scope="module")
def recording(tmp_path_factory) -> tuple[str, int]:
    """A recording of one 1 x 1 x 2 nested workload (and the warm-up's spans), and
    the spans the plugin handed over meanwhile."""
    path = str(tmp_path_factory.mktemp("child") / "frames.pickle")
    return path, record_tree(TREE, path, 1, 1, 1, 2)


def test_a_replay_exports_every_span_the_recording_handed_over(recording):
    path, handed_over = recording
    result = replay_tree(TREE, path)
    # at least the 2 leaves, their 2 ancestors and the gather's span
    assert handed_over >= 5
    assert result["spans"] == handed_over
    assert set(FIGURES) <= set(result)


def test_a_replay_counts_the_cpu_of_its_threads(recording):
    result = replay_tree(TREE, recording[0])
    threads = sum(result[k] for k in FIGURES if k not in ("cpu", "gc"))
    assert result["cpu"] > 0 and result["main"] > 0 and result["emitter"] > 0
    # the threads' clocks, read 3 s before the stream ends, within the process's
    assert threads <= result["cpu"] * 1.05


def test_a_recording_replays_the_stream_of_its_last_export_process(tmp_path):
    path = tmp_path / "frames.pickle"
    with open(path, "wb") as f:
        for record in [("spec", "first"), ("frame", 1.0, b"a"), ("spec", "second"),
                       ("frame", 2.0, b"b"), ("frame", 2.5, b"c")]:
            pickle.dump(record, f)
    assert load_stream(str(path)) == ("second", [(2.0, b"b"), (2.5, b"c")])


def test_a_recording_without_an_export_process_is_refused(tmp_path):
    path = tmp_path / "frames.pickle"
    path.write_bytes(b"")
    with pytest.raises(ValueError, match="no export process"):
        load_stream(str(path))

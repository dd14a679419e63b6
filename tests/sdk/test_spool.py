"""The spool on its own: held batches in memory, then on disk, bounded, oldest first;
left for the next process; shared by several; corrupt files skipped."""
from __future__ import annotations

import logging
import os

from dask_otel_spans.sdk.spool import Spool


def batches(spool: Spool, signal: str = "traces") -> list[bytes]:
    """Every batch of ``signal`` the spool holds, oldest first (each acknowledged)."""
    out = []
    while (entry := spool.oldest(signal)) is not None:
        out.append(entry.payload)
        spool.done(entry)
    return out


def files(directory) -> list[str]:
    return sorted(f for _, _, fs in os.walk(directory) for f in fs if f.endswith(".pb"))


def test_a_held_batch_waits_in_memory_until_it_is_due_for_disk(tmp_path):
    spool = Spool(str(tmp_path), max_memory=10_000, max_disk=10_000, spill_after=60)
    spool.open()
    spool.put("traces", b"a" * 10, 3)
    assert spool.figures("traces") == {"held": 3, "spooled": 0, "dropped": 0}
    assert files(tmp_path) == []
    spool.spill_after = 0
    spool.spill_due()
    assert spool.figures("traces") == {"held": 0, "spooled": 3, "dropped": 0}
    assert len(files(tmp_path)) == 1


def test_a_spilled_batch_is_the_encoded_request_byte_for_byte(tmp_path):
    payload = bytes(range(256)) * 3
    spool = Spool(str(tmp_path), max_memory=0, max_disk=10_000)
    spool.open()
    spool.put("logs", payload, 2)
    [name] = files(tmp_path)
    [path] = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path) for f in fs if f == name]
    with open(path, "rb") as f:
        assert f.read() == payload
    assert batches(spool, "logs") == [payload]
    assert files(tmp_path) == []  # (acknowledged: it left the spool)


def test_past_max_memory_the_oldest_go_to_disk(tmp_path):
    spool = Spool(str(tmp_path), max_memory=25, max_disk=10_000, spill_after=60)
    spool.open()
    for i in range(5):
        spool.put("traces", bytes([i]) * 10, 1)
    assert spool.figures("traces") == {"held": 2, "spooled": 3, "dropped": 0}
    assert batches(spool) == [bytes([i]) * 10 for i in range(5)]


def test_memory_only_past_max_memory_drops_the_oldest_with_one_error_line(caplog):
    spool = Spool(None, max_memory=25, max_disk=10_000)
    spool.open()
    with caplog.at_level(logging.ERROR, logger="dask_otel_spans"):
        for i in range(5):
            spool.put("traces", bytes([i]) * 10, 2)
    assert spool.figures("traces") == {"held": 4, "spooled": 0, "dropped": 6}
    assert batches(spool) == [bytes([3]) * 10, bytes([4]) * 10]
    [line] = [r.getMessage() for r in caplog.records if "spool is full" in r.getMessage()]
    assert "otel-spans.spool.max-memory" in line


def test_past_max_disk_the_oldest_are_dropped_with_one_error_line(tmp_path, caplog):
    spool = Spool(str(tmp_path), max_memory=0, max_disk=35)
    spool.open()
    with caplog.at_level(logging.ERROR, logger="dask_otel_spans"):
        for i in range(6):
            spool.put("traces", bytes([i]) * 10, 1)
    assert spool.figures("traces") == {"held": 0, "spooled": 3, "dropped": 3}
    assert len(files(tmp_path)) == 3
    [line] = [r.getMessage() for r in caplog.records if "spool is full" in r.getMessage()]
    assert "otel-spans.spool.max-disk" in line
    assert batches(spool) == [bytes([i]) * 10 for i in (3, 4, 5)]


def test_the_drop_line_is_said_again_after_a_recovery(caplog):
    spool = Spool(None, max_memory=10, max_disk=0)
    with caplog.at_level(logging.ERROR, logger="dask_otel_spans"):
        for _ in range(3):
            spool.put("traces", b"x" * 10, 1)
        spool.recovered("traces")
        for _ in range(3):
            spool.put("traces", b"x" * 10, 1)
    assert caplog.text.count("spool is full") == 2


def test_a_directory_that_cannot_be_written_is_one_line_and_memory_only(tmp_path, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    spool = Spool(str(blocker / "spool"), max_memory=100, max_disk=100, spill_after=0)
    with caplog.at_level(logging.ERROR, logger="dask_otel_spans"):
        spool.open()
        spool.put("traces", b"x" * 10, 1)
        spool.spill_due()
    assert spool.directory is None
    assert spool.figures("traces") == {"held": 1, "spooled": 0, "dropped": 0}
    assert len([r for r in caplog.records if "cannot write the spool" in r.getMessage()]) == 1


def test_what_is_held_at_close_is_sent_first_by_the_next_spool(tmp_path):
    first = Spool(str(tmp_path), max_memory=10_000, max_disk=10_000, spill_after=60)
    first.open()
    first.put("traces", b"old-1", 1)
    first.put("logs", b"log-1", 1)
    first.put("traces", b"old-2", 1)
    first.close()  # (in memory until now: written)
    second = Spool(str(tmp_path), max_memory=10_000, max_disk=10_000)
    second.open()
    second.put("traces", b"new", 1)
    assert batches(second) == [b"old-1", b"old-2", b"new"]
    assert batches(second, "logs") == [b"log-1"]


def test_a_running_spool_keeps_its_batches_from_another(tmp_path):
    running = Spool(str(tmp_path), max_memory=0, max_disk=10_000)
    running.open()
    running.put("traces", b"mine", 1)
    other = Spool(str(tmp_path), max_memory=0, max_disk=10_000)
    other.open()
    assert batches(other) == []
    assert batches(running) == [b"mine"]


def test_a_corrupt_entry_is_skipped_with_one_line_and_the_rest_is_sent(tmp_path, caplog):
    first = Spool(str(tmp_path), max_memory=0, max_disk=10_000)
    first.open()
    for payload in (b"one-1234", b"two-1234", b"three-12"):
        first.put("traces", payload, 1)
    first.close()
    [second_file] = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path)
                     for f in sorted(fs) if f.endswith(".pb")][1:2]
    with open(second_file, "r+b") as f:
        f.truncate(3)
    spool = Spool(str(tmp_path), max_memory=0, max_disk=10_000)
    with caplog.at_level(logging.ERROR, logger="dask_otel_spans"):
        spool.open()
        assert batches(spool) == [b"one-1234", b"three-12"]
    [line] = [r.getMessage() for r in caplog.records if "corrupt" in r.getMessage()]
    assert "skipped" in line
    corrupt = os.path.basename(second_file) + ".corrupt"  # (kept, in the new folder)
    assert any(corrupt in fs for _, _, fs in os.walk(tmp_path))


def left_by_an_ended_export(directory) -> None:
    left = Spool(str(directory), max_memory=0, max_disk=10_000)
    left.open()
    left.put("traces", b"a" * 10, 3)
    left.close()


def test_what_an_ended_export_left_is_said_at_the_level_asked(tmp_path, caplog):
    """WARNING in an export process (after a crash); INFO where sending it is what
    was asked (``dask-otel-spans resend``): 1 batch, not 1 batches."""
    left_by_an_ended_export(tmp_path)
    caplog.set_level(logging.INFO, logger="dask_otel_spans")
    Spool(str(tmp_path), max_memory=0, max_disk=10_000, adopted_level=logging.INFO).open()
    [record] = [r for r in caplog.records if "left in the spool" in r.getMessage()]
    assert record.levelno == logging.INFO
    assert record.getMessage().startswith("dask_otel_spans: 1 batch left in the spool ")

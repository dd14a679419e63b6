"""The spool on its own: held batches in memory, then on disk, bounded, oldest first,
each bound to its destination; left for the next process of that destination; shared
by several; corrupt files skipped; a directory trusted only as far as it is checked
(owner and mode, no links followed, only regular files read, figures bounded)."""
from __future__ import annotations

import logging
import os
import threading
import zlib

import pytest

from dask_otel_spans.sdk.destination import Destination
from dask_otel_spans.sdk.spool import Spool
from dask_otel_spans.sdk.spoolfiles import why_not_private

TRACES = Destination.of("traces", "grpc", "http://collector-a:4317", {})
LOGS = Destination.of("logs", "grpc", "http://collector-a:4317", {})
#: the same signal elsewhere
OTHER = Destination.of("traces", "grpc", "http://collector-b:4317", {})


def accepting(*destinations: Destination):
    """An ``accept`` that takes the batches held for ``destinations``."""
    by_key = {d.key: d for d in destinations}
    return lambda signal, key, destination: by_key.get(key)


def batches(spool: Spool, destination: Destination = TRACES) -> list[bytes]:
    """Every batch held for ``destination``, oldest first (each acknowledged)."""
    out = []
    while (entry := spool.oldest(destination.key)) is not None:
        out.append(entry.payload)
        spool.done(entry)
    return out


def files(directory) -> list[str]:
    return sorted(f for _, _, fs in os.walk(directory) for f in fs if f.endswith(".pb"))


def paths(directory) -> list[str]:
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(directory) for f in fs
                  if f.endswith(".pb"))


def opened(directory, *destinations: Destination, **kwargs) -> Spool:
    spool = Spool(str(directory), max_memory=0, max_disk=10_000, **kwargs)
    spool.open(accepting(*destinations))
    return spool


def left_by_an_ended_export(directory, destination: Destination = TRACES,
                            payloads: tuple[bytes, ...] = (b"a" * 10,)) -> None:
    left = opened(directory)
    for payload in payloads:
        left.put(destination, payload, 3)
    left.close()


def dead_folder(directory) -> str:
    """The folder of an export that ended (made for files planted in it)."""
    left_by_an_ended_export(directory, payloads=(b"real-one",))
    [folder] = [os.path.join(directory, d) for d in os.listdir(directory)]
    return folder


def batch_file(items: int, payload: bytes, signal: str = "traces",
               destination: Destination = TRACES) -> str:
    """A name as the spool writes them (``items`` as claimed)."""
    return (f"{1:020d}-{1:08d}-{items}-{zlib.crc32(payload):08x}."
            f"{destination.key}.{signal}.pb")


def test_a_held_batch_waits_in_memory_until_it_is_due_for_disk(tmp_path):
    spool = Spool(str(tmp_path), max_memory=10_000, max_disk=10_000, spill_after=60)
    spool.open()
    spool.put(TRACES, b"a" * 10, 3)
    assert spool.figures(TRACES.key) == {"held": 3, "spooled": 0, "dropped": 0}
    assert files(tmp_path) == []
    spool.spill_after = 0
    spool.spill_due()
    assert spool.figures(TRACES.key) == {"held": 0, "spooled": 3, "dropped": 0}
    assert len(files(tmp_path)) == 1


def test_a_spilled_batch_is_the_encoded_request_byte_for_byte(tmp_path):
    payload = bytes(range(256)) * 3
    spool = opened(tmp_path)
    spool.put(LOGS, payload, 2)
    [path] = paths(tmp_path)
    with open(path, "rb") as f:
        assert f.read() == payload
    assert batches(spool, LOGS) == [payload]
    assert files(tmp_path) == []  # (acknowledged: it left the spool)


def test_past_max_memory_the_oldest_go_to_disk(tmp_path):
    spool = Spool(str(tmp_path), max_memory=25, max_disk=10_000, spill_after=60)
    spool.open()
    for i in range(5):
        spool.put(TRACES, bytes([i]) * 10, 1)
    assert spool.figures(TRACES.key) == {"held": 2, "spooled": 3, "dropped": 0}
    assert batches(spool) == [bytes([i]) * 10 for i in range(5)]


def test_memory_only_past_max_memory_drops_the_oldest_with_one_error_line(caplog):
    spool = Spool(None, max_memory=25, max_disk=10_000)
    spool.open()
    with caplog.at_level(logging.ERROR, logger="dask_otel_spans"):
        for i in range(5):
            spool.put(TRACES, bytes([i]) * 10, 2)
    assert spool.figures(TRACES.key) == {"held": 4, "spooled": 0, "dropped": 6}
    assert batches(spool) == [bytes([3]) * 10, bytes([4]) * 10]
    [line] = [r.getMessage() for r in caplog.records if "spool is full" in r.getMessage()]
    assert "otel-spans.spool.max-memory" in line


def test_past_max_disk_the_oldest_are_dropped_with_one_error_line(tmp_path, caplog):
    spool = Spool(str(tmp_path), max_memory=0, max_disk=35)
    spool.open()
    with caplog.at_level(logging.ERROR, logger="dask_otel_spans"):
        for i in range(6):
            spool.put(TRACES, bytes([i]) * 10, 1)
    assert spool.figures(TRACES.key) == {"held": 0, "spooled": 3, "dropped": 3}
    assert len(files(tmp_path)) == 3
    [line] = [r.getMessage() for r in caplog.records if "spool is full" in r.getMessage()]
    assert "otel-spans.spool.max-disk" in line
    assert batches(spool) == [bytes([i]) * 10 for i in (3, 4, 5)]


def test_the_drop_line_is_said_again_after_a_recovery(caplog):
    spool = Spool(None, max_memory=10, max_disk=0)
    with caplog.at_level(logging.ERROR, logger="dask_otel_spans"):
        for _ in range(3):
            spool.put(TRACES, b"x" * 10, 1)
        spool.recovered(TRACES.key)
        for _ in range(3):
            spool.put(TRACES, b"x" * 10, 1)
    assert caplog.text.count("spool is full") == 2


def test_a_directory_that_cannot_be_written_is_one_line_and_memory_only(tmp_path, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    spool = Spool(str(blocker / "spool"), max_memory=100, max_disk=100, spill_after=0)
    with caplog.at_level(logging.ERROR, logger="dask_otel_spans"):
        spool.open()
        spool.put(TRACES, b"x" * 10, 1)
        spool.spill_due()
    assert spool.directory is None
    assert spool.figures(TRACES.key) == {"held": 1, "spooled": 0, "dropped": 0}
    assert len([r for r in caplog.records if "cannot write the spool" in r.getMessage()]) == 1


def test_what_is_held_at_close_is_sent_first_by_the_next_spool(tmp_path):
    first = Spool(str(tmp_path), max_memory=10_000, max_disk=10_000, spill_after=60)
    first.open()
    first.put(TRACES, b"old-1", 1)
    first.put(LOGS, b"log-1", 1)
    first.put(TRACES, b"old-2", 1)
    first.close()  # (in memory until now: written)
    second = opened(tmp_path, TRACES, LOGS)
    second.put(TRACES, b"new", 1)
    assert batches(second) == [b"old-1", b"old-2", b"new"]
    assert batches(second, LOGS) == [b"log-1"]


def test_a_running_spool_keeps_its_batches_from_another(tmp_path):
    running = opened(tmp_path)
    running.put(TRACES, b"mine", 1)
    other = opened(tmp_path, TRACES)
    assert batches(other) == []
    assert batches(running) == [b"mine"]


def test_a_corrupt_entry_is_skipped_with_one_line_and_the_rest_is_sent(tmp_path, caplog):
    left_by_an_ended_export(tmp_path, payloads=(b"one-1234", b"two-1234", b"three-12"))
    second_file = paths(tmp_path)[1]
    with open(second_file, "r+b") as f:
        f.truncate(3)
    with caplog.at_level(logging.ERROR, logger="dask_otel_spans"):
        spool = opened(tmp_path, TRACES)
        assert batches(spool) == [b"one-1234", b"three-12"]
    [line] = [r.getMessage() for r in caplog.records if "corrupt" in r.getMessage()]
    assert "skipped" in line
    corrupt = os.path.basename(second_file) + ".corrupt"  # (kept, in the new folder)
    assert any(corrupt in fs for _, _, fs in os.walk(tmp_path))


def test_what_an_ended_export_left_is_said_at_the_level_asked(tmp_path, caplog):
    """WARNING in an export process (after a crash); INFO where sending it is what
    was asked (``dask-otel-spans resend``): 1 batch, not 1 batches."""
    left_by_an_ended_export(tmp_path)
    caplog.set_level(logging.INFO, logger="dask_otel_spans")
    opened(tmp_path, TRACES, adopted_level=logging.INFO)
    [record] = [r for r in caplog.records if "left in the spool" in r.getMessage()]
    assert record.levelno == logging.INFO
    assert record.getMessage().startswith("dask_otel_spans: 1 batch left in the spool ")


# -- each batch bound to its destination ---------------------------------------------


def test_a_spool_takes_over_only_the_batches_of_the_destinations_it_accepts(tmp_path):
    left_by_an_ended_export(tmp_path, OTHER, payloads=(b"for-b",))
    left_by_an_ended_export(tmp_path, TRACES, payloads=(b"for-a",))
    spool = opened(tmp_path, TRACES)
    assert batches(spool) == [b"for-a"]
    assert batches(spool, OTHER) == []
    assert [(x.signal, x.destination, x.batches, x.items) for x in spool.left] == [
        ("traces", OTHER, 1, 3)]


def test_batches_left_for_another_destination_stay_for_a_spool_of_theirs(tmp_path):
    left_by_an_ended_export(tmp_path, OTHER, payloads=(b"for-b",))
    opened(tmp_path, TRACES).close()
    assert batches(opened(tmp_path, OTHER), OTHER) == [b"for-b"]


def test_the_same_endpoint_with_other_credentials_is_another_destination(tmp_path):
    team_a = Destination.of("traces", "grpc", "http://collector:4317", {"api-key": "a"})
    team_b = Destination.of("traces", "grpc", "http://collector:4317", {"api-key": "b"})
    left_by_an_ended_export(tmp_path, team_a, payloads=(b"team-a",))
    spool = opened(tmp_path, team_b)
    assert batches(spool, team_b) == []
    assert [x.destination for x in spool.left] == [
        Destination("traces", "grpc", "http://collector:4317", team_a.credentials)]


def test_a_destination_is_stored_without_its_credentials(tmp_path):
    secret = Destination.of("traces", "http/protobuf",
                            "https://jane:pass-word@collector:4318/v1/traces",
                            {"api-key": "key-value"})
    left_by_an_ended_export(tmp_path, secret)
    stored = b"".join((open(os.path.join(d, f), "rb").read() + f.encode())
                      for d, _, fs in os.walk(tmp_path) for f in fs)
    assert b"pass-word" not in stored and b"key-value" not in stored
    assert b"jane" not in stored
    [found] = opened(tmp_path).left
    assert found.destination.endpoint == "https://collector:4318/v1/traces"
    assert found.destination.key == secret.key


def test_a_batch_whose_record_is_gone_is_taken_only_by_the_key_in_its_name(tmp_path):
    left_by_an_ended_export(tmp_path, payloads=(b"keyed",))
    [record] = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path) for f in fs
                if f.endswith(".destination")]
    os.unlink(record)
    asked = []
    spool = Spool(str(tmp_path), max_memory=0, max_disk=10_000)
    spool.open(lambda signal, key, destination: asked.append((key, destination)))
    assert asked == [(TRACES.key, None)]
    assert batches(opened(tmp_path, TRACES)) == [b"keyed"]


def test_a_record_that_does_not_match_its_key_is_no_destination(tmp_path):
    left_by_an_ended_export(tmp_path, payloads=(b"keyed",))
    [record] = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path) for f in fs
                if f.endswith(".destination")]
    with open(record, "wb") as f:
        f.write(OTHER.record())  # (another destination's record under this key)
    [found] = opened(tmp_path).left
    assert found.key == TRACES.key and found.destination is None


def test_a_batch_written_before_destinations_were_stored_is_of_none(tmp_path):
    folder = dead_folder(tmp_path)
    old = f"{2:020d}-{1:08d}-1-{zlib.crc32(b'old'):08x}.traces.pb"
    (tmp_path / folder / old).write_bytes(b"old")
    asked = []
    Spool(str(tmp_path), max_memory=0, max_disk=10_000).open(
        lambda signal, key, destination: asked.append((signal, key, destination)))
    assert ("traces", None, None) in asked


# -- a directory trusted only as far as it is checked ----------------------------------


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o1777])
def test_a_spool_directory_others_may_write_is_one_error_line_and_memory_only(
        tmp_path, caplog, mode):
    directory = tmp_path / "spool"
    directory.mkdir()
    directory.chmod(mode)
    spool = Spool(str(directory), max_memory=100, max_disk=100, spill_after=0)
    with caplog.at_level(logging.ERROR, logger="dask_otel_spans"):
        spool.open()
        spool.put(TRACES, b"x" * 10, 1)
        spool.spill_due()
    [line] = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert "cannot be trusted" in line and "writable by group or others" in line
    assert "memory only" in line
    assert spool.directory is None and os.listdir(directory) == []
    assert spool.figures(TRACES.key)["held"] == 1


def test_a_folder_in_it_others_may_write_makes_it_memory_only(tmp_path, caplog):
    left_by_an_ended_export(tmp_path)
    [folder] = os.listdir(tmp_path)
    (tmp_path / folder).chmod(0o777)
    with caplog.at_level(logging.ERROR, logger="dask_otel_spans"):
        spool = opened(tmp_path, TRACES)
    assert spool.directory is None and batches(spool) == []
    [line] = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert folder in line and "mode 0777" in line


def test_a_folder_of_another_user_may_not_hold_batches():
    st = os.stat_result((0o40700, 0, 0, 1, os.geteuid() + 1, 0, 0, 0, 0, 0))
    assert why_not_private(st) == (f"owned by uid {os.geteuid() + 1}, not this user "
                                   f"(uid {os.geteuid()})")
    mine = os.stat_result((0o40700, 0, 0, 1, os.geteuid(), 0, 0, 0, 0, 0))
    assert why_not_private(mine) is None


def test_a_fifo_named_like_a_batch_is_skipped_with_one_line_and_never_blocks(
        tmp_path, caplog):
    folder = dead_folder(tmp_path)
    fifo = batch_file(1, b"never")
    os.mkfifo(os.path.join(folder, fifo))
    spool = Spool(str(tmp_path), max_memory=0, max_disk=10_000)
    with caplog.at_level(logging.WARNING, logger="dask_otel_spans"):
        opening = threading.Thread(target=spool.open, args=(accepting(TRACES),),
                                   daemon=True)
        opening.start()
        opening.join(10)
        assert not opening.is_alive()
        assert batches(spool) == [b"real-one"]
    [line] = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert fifo in line


def test_a_batch_swapped_for_a_fifo_after_it_was_taken_is_skipped_not_waited_on(
        tmp_path, caplog):
    left_by_an_ended_export(tmp_path, payloads=(b"swapped", b"sent"))
    spool = opened(tmp_path, TRACES)
    first = paths(tmp_path)[0]
    os.unlink(first)
    os.mkfifo(first)
    got = []
    reading = threading.Thread(target=lambda: got.extend(batches(spool)), daemon=True)
    with caplog.at_level(logging.ERROR, logger="dask_otel_spans"):
        reading.start()
        reading.join(10)
    assert not reading.is_alive() and got == [b"sent"]
    assert len([r for r in caplog.records if "not a regular file" in r.getMessage()]) == 1


def test_a_batch_file_that_is_a_link_is_never_read(tmp_path, caplog):
    outside = tmp_path / "outside"
    outside.write_bytes(b"someone-else's")
    spool_dir = tmp_path / "spool"
    spool_dir.mkdir(mode=0o700)
    folder = dead_folder(spool_dir)
    link = batch_file(1, b"someone-else's")
    os.symlink(outside, os.path.join(folder, link))
    with caplog.at_level(logging.WARNING, logger="dask_otel_spans"):
        spool = opened(spool_dir, TRACES)
        assert batches(spool) == [b"real-one"]
    assert any(link in r.getMessage() for r in caplog.records)
    assert outside.read_bytes() == b"someone-else's"


def test_a_folder_that_is_a_link_is_not_taken_over(tmp_path, caplog):
    elsewhere = tmp_path / "elsewhere"
    left_by_an_ended_export(elsewhere, payloads=(b"not-in-the-spool",))
    [folder] = os.listdir(elsewhere)
    spool_dir = tmp_path / "spool"
    spool_dir.mkdir(mode=0o700)
    os.symlink(elsewhere / folder, spool_dir / "planted")
    with caplog.at_level(logging.WARNING, logger="dask_otel_spans"):
        spool = opened(spool_dir, TRACES)
        assert batches(spool) == []
    assert len(files(elsewhere / folder)) == 1  # (not moved, not read)
    [line] = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert "'planted'" in line


def test_an_own_folder_swapped_for_a_link_does_not_take_the_next_batches_there(
        tmp_path):
    spool_dir = tmp_path / "spool"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    spool = opened(spool_dir)
    [own] = os.listdir(spool_dir)
    os.rename(spool_dir / own, spool_dir / "moved")
    os.symlink(elsewhere, spool_dir / own)
    spool.put(TRACES, b"mine", 1)
    assert os.listdir(elsewhere) == []
    assert batches(spool) == [b"mine"]


@pytest.mark.parametrize("items", ["9" * 25, str(2**64 + 1), "12"])
def test_a_name_claiming_figures_out_of_bounds_is_skipped_and_counts_nothing(
        tmp_path, caplog, items):
    """(``12`` items in a 3-byte file: an item takes one byte at least.)"""
    folder = dead_folder(tmp_path)
    name = (f"{2:020d}-{1:08d}-{items}-{zlib.crc32(b'abc'):08x}."
            f"{TRACES.key}.traces.pb")
    with open(os.path.join(folder, name), "wb") as f:
        f.write(b"abc")
    with caplog.at_level(logging.WARNING, logger="dask_otel_spans"):
        spool = opened(tmp_path, TRACES)
    assert spool.figures(TRACES.key) == {"held": 0, "spooled": 3, "dropped": 0}
    assert batches(spool) == [b"real-one"]
    [line] = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert name in line

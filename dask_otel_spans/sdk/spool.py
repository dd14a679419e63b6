"""The spool: batches an exporter could not deliver, kept as encoded OTLP requests
(the protobuf bytes of ``Export*ServiceRequest``), oldest first per signal; in
memory up to one bound, written to a directory once they waited
:data:`SPILL_AFTER` seconds or past the memory bound, up to a second bound; past
both the oldest are dropped and counted.

On disk, each process writes below a folder of its own, ``DIR/<owner>/``, locked
(``flock``) while it lives; one file per batch, written under a temporary name and
renamed. A process that opens the directory takes over (renames into its own folder)
the files of owners whose lock it can take: their process ended. Several processes
share a directory without sending one batch twice. A file's name carries its order,
signal, item count and checksum: a truncated or corrupt file is set aside
(``*.corrupt``) with one line, and the rest is sent."""
from __future__ import annotations

import logging
import os
import re
import threading
import time
import uuid
import zlib
from collections import deque
from dataclasses import dataclass
from typing import IO

from dask_otel_spans.protocol.figures import SIGNALS
from dask_otel_spans.wording import counted

logger = logging.getLogger(__name__)

#: Seconds a held batch waits in memory before it is written to the directory: what
#: a SIGKILL of the process can lose of what it held
SPILL_AFTER = 1.0
#: ``otel-spans.spool.directory: auto``: this folder below the user's cache directory
AUTO = "auto"
_LOCK = ".lock"
_NAME = re.compile(
    r"^(?P<stamp>\d{20})-(?P<seq>\d{8})-(?P<items>\d+)-(?P<crc>[0-9a-f]{8})"
    r"\.(?P<signal>traces|metrics|logs)\.pb$"
)


def user_spool_directory() -> str:
    """``$XDG_CACHE_HOME/dask-otel-spans/spool``, else ``~/.cache/...``."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(
        os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "dask-otel-spans", "spool")


def resolve_directory(value: str | None) -> str | None:
    """The spool directory of the setting's value (``auto``: :func:`user_spool_directory`;
    None: memory only)."""
    if value is None:
        return None
    return user_spool_directory() if value.strip().lower() == AUTO else value


@dataclass(eq=False)
class Entry:
    """One held batch: its signal, items (spans, log records, points), and where it
    is: ``payload`` in memory, ``path`` on disk (one of them, or both while read)."""

    signal: str
    items: int
    size: int
    stamp: int
    payload: bytes | None = None
    path: str | None = None
    held_at: float = 0.0


class Spool:
    """Held batches of every signal, bounded, in memory then on disk (thread-safe).

    Parameters
    ----------
    directory:
        Where batches are written; None keeps them in memory only
    max_memory:
        Bytes of batches kept in memory; past it the oldest are written (or, with no
        directory, dropped)
    max_disk:
        Bytes of batches kept on disk; past it the oldest are dropped
    spill_after:
        Seconds a batch waits in memory before it is written
    adopted_level:
        The level of the line that says how many batches an export that ended left
        (sent first): INFO where sending them is what was asked
        (``dask-otel-spans resend``)
    """

    def __init__(self, directory: str | None, max_memory: int, max_disk: int,
                 spill_after: float = SPILL_AFTER, adopted_level: int = logging.WARNING):
        self.directory = directory
        self.adopted_level = adopted_level
        self.max_memory = max_memory
        self.max_disk = max_disk
        self.spill_after = spill_after
        self._queues: dict[str, deque[Entry]] = {s: deque() for s in SIGNALS}
        self._memory = 0
        self._disk = 0
        self._dropped = dict.fromkeys(SIGNALS, 0)
        self._drop_said: set[str] = set()
        self._lock = threading.RLock()
        self._own: str | None = None
        self._lock_file: IO[bytes] | None = None
        self._seq = 0
        self._closed = False

    # -- opening and closing ---------------------------------------------------------

    def open(self) -> None:
        """Take a folder of its own in the directory, and the batches of owners that
        ended (oldest first). A directory that cannot be written: one line, memory
        only. Opening it again does nothing."""
        if self.directory is None or self._own is not None:
            return
        try:
            # (telemetry may carry data: folders of the user's only)
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            own = os.path.join(self.directory, f"{os.getpid()}-{uuid.uuid4().hex[:8]}")
            os.makedirs(own, mode=0o700)
            lock = open(os.path.join(own, _LOCK), "wb")
            _flock(lock)
        except OSError as e:
            logger.error(
                "dask_otel_spans: cannot write the spool directory %s (%s); batches "
                "that cannot be delivered are held in memory only, up to "
                "otel-spans.spool.max-memory", self.directory, e)
            self.directory = None
            return
        self._own, self._lock_file = own, lock
        self._adopt()

    def _take_over(self, folder: str) -> None:
        """Move the batches of the spool folder of an owner that ended into this
        one's (nothing when its owner runs: its batches are its own)."""
        assert self._own is not None
        try:
            lock = open(os.path.join(folder, _LOCK), "ab")
        except OSError:
            return
        try:
            if not _flock(lock, wait=False):
                return
            for file in os.listdir(folder):
                if _NAME.match(file):
                    os.rename(os.path.join(folder, file), os.path.join(self._own, file))
            if not [f for f in os.listdir(folder) if f != _LOCK]:
                os.unlink(os.path.join(folder, _LOCK))
                os.rmdir(folder)
        except OSError as e:
            logger.warning("dask_otel_spans: cannot take over the spool folder %s (%s)",
                           folder, e)
        finally:
            lock.close()

    def _adopt(self) -> None:
        """Move in the files of owners that ended, and load their entries."""
        assert self.directory is not None and self._own is not None
        found: list[Entry] = []
        for name in sorted(os.listdir(self.directory)):
            folder = os.path.join(self.directory, name)
            if folder != self._own and os.path.isdir(folder):
                self._take_over(folder)
        for file in os.listdir(self._own):
            match = _NAME.match(file)
            if match:
                path = os.path.join(self._own, file)
                found.append(Entry(match["signal"], int(match["items"]),
                                   os.path.getsize(path), int(match["stamp"]), path=path))
        found.sort(key=lambda e: e.stamp)
        with self._lock:
            for entry in found:
                self._queues[entry.signal].append(entry)
                self._disk += entry.size
        if found:
            logger.log(self.adopted_level,
                       "dask_otel_spans: %s left in the spool %s by an export that "
                       "ended: sent first", counted(len(found), "batch", "batches"),
                       self.directory)

    def close(self, release: bool = True) -> None:
        """Write what is held in memory to the directory (kept there for the next
        process with it) and, with ``release``, release the folder
        (:meth:`release`); from now on a batch put is written at once."""
        with self._lock:
            self._closed = True
            for queue in self._queues.values():
                for entry in list(queue):
                    if entry.path is None:
                        self._write(entry)
        if release:
            self.release()

    def release(self) -> None:
        """Release the folder (removed when empty): from now on another process
        may take over what it holds. (Not while a batch of it is in flight: were it
        acknowledged, that process would send it again.)"""
        if self._lock_file is not None:
            own = self._own
            if own is not None and not [f for f in os.listdir(own) if f != _LOCK]:
                try:
                    os.unlink(os.path.join(own, _LOCK))
                    os.rmdir(own)
                except OSError:
                    pass
            self._lock_file.close()
            self._lock_file = None

    # -- holding ---------------------------------------------------------------------

    def put(self, signal: str, payload: bytes, items: int) -> None:
        """Hold one encoded request of ``signal`` (the newest)."""
        with self._lock:
            self._seq += 1
            entry = Entry(signal, items, len(payload), time.time_ns(), payload,
                          held_at=time.monotonic())
            self._queues[signal].append(entry)
            self._memory += entry.size
            if self._closed:
                self._write(entry)
            self._bound_memory()

    def spill_due(self, now: float | None = None) -> None:
        """Write the batches that waited :attr:`spill_after` seconds in memory."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if self._own is None:
                return
            for queue in self._queues.values():
                for entry in list(queue):
                    if entry.path is None and now - entry.held_at >= self.spill_after:
                        self._write(entry)

    def oldest(self, signal: str) -> Entry | None:
        """The oldest batch of ``signal`` with its payload (read back from disk when
        it is there only); None when none is held. Corrupt files are set aside."""
        while True:
            with self._lock:
                queue = self._queues[signal]
                if not queue:
                    return None
                entry = queue[0]
                if entry.payload is not None:
                    return entry
                path = entry.path
            payload = _read(path) if path is not None else None
            with self._lock:
                if queue and queue[0] is entry:
                    if payload is not None:
                        return Entry(entry.signal, entry.items, entry.size, entry.stamp,
                                     payload, entry.path, entry.held_at)
                    queue.popleft()
                    self._disk -= entry.size

    def done(self, entry: Entry) -> None:
        """``entry`` was acknowledged (or refused for good): it leaves the spool."""
        with self._lock:
            queue = self._queues[entry.signal]
            for i, held in enumerate(queue):
                if held.stamp == entry.stamp and held.size == entry.size:
                    del queue[i]
                    self._forget(held)
                    return

    def waiting(self, signal: str) -> bool:
        with self._lock:
            return bool(self._queues[signal])

    def figures(self, signal: str) -> dict[str, int]:
        """``held`` (items waiting in memory), ``spooled`` (items waiting on disk
        only) and ``dropped`` (past the bounds) of ``signal``."""
        with self._lock:
            queue = self._queues[signal]
            return {
                "held": sum(e.items for e in queue if e.path is None),
                "spooled": sum(e.items for e in queue if e.path is not None),
                "dropped": self._dropped[signal],
            }

    def recovered(self, signal: str) -> int:
        """The backend of ``signal`` answers again: the next drop is said again.
        Items dropped since the last recovery."""
        with self._lock:
            self._drop_said.discard(signal)
            return self._dropped[signal]

    # -- inside (under the lock) ---------------------------------------------------------

    def _forget(self, entry: Entry) -> None:
        if entry.path is None:
            self._memory -= entry.size
        else:
            self._disk -= entry.size
            try:
                os.unlink(entry.path)
            except OSError:
                pass

    def _bound_memory(self) -> None:
        """Past ``max_memory``: write the oldest in memory, or drop them."""
        while self._memory > self.max_memory:
            oldest = min((e for q in self._queues.values() for e in q
                          if e.payload is not None),
                         key=lambda e: e.stamp, default=None)
            if oldest is None:
                return
            if self._own is None or not self._write(oldest):
                self._drop(oldest, "max-memory")

    def _write(self, entry: Entry) -> bool:
        """Write ``entry`` to the folder (its payload leaves memory); False when it
        cannot be written."""
        if self._own is None or entry.payload is None:
            return False
        self._seq += 1
        name = (f"{entry.stamp:020d}-{self._seq:08d}-{entry.items}-"
                f"{zlib.crc32(entry.payload):08x}.{entry.signal}.pb")
        path = os.path.join(self._own, name)
        try:
            with open(path + ".tmp", "wb") as f:
                f.write(entry.payload)
            os.rename(path + ".tmp", path)
        except OSError as e:
            logger.error("dask_otel_spans: cannot write to the spool %s (%s); held "
                         "batches stay in memory", self.directory, e)
            self._own = None
            return False
        entry.path, entry.payload = path, None
        self._memory -= entry.size
        self._disk += entry.size
        while self._disk > self.max_disk:
            oldest = min((e for q in self._queues.values() for e in q
                          if e.path is not None), key=lambda e: e.stamp)
            self._drop(oldest, "max-disk")
        return True

    def _drop(self, entry: Entry, bound: str) -> None:
        queue = self._queues[entry.signal]
        queue.remove(entry)
        self._forget(entry)
        self._dropped[entry.signal] += entry.items
        if entry.signal not in self._drop_said:
            self._drop_said.add(entry.signal)
            logger.error(
                "dask_otel_spans: the spool is full: dropping the oldest held %s (%d "
                "so far; otel-spans.spool.%s raises the bound); logged once per "
                "outage, ExportState.dropped counts them",
                entry.signal, self._dropped[entry.signal], bound)


def _read(path: str) -> bytes | None:
    """A spool file's payload; None (one line, the file set aside) when it is
    truncated, corrupt or gone."""
    match = _NAME.match(os.path.basename(path))
    try:
        with open(path, "rb") as f:
            payload = f.read()
    except OSError as e:
        logger.error("dask_otel_spans: cannot read the spool file %s (%s); skipped",
                     path, e)
        return None
    if match is not None and f"{zlib.crc32(payload):08x}" == match["crc"]:
        return payload
    logger.error("dask_otel_spans: the spool file %s is truncated or corrupt; "
                 "skipped (kept as %s.corrupt)", path, os.path.basename(path))
    try:
        os.rename(path, path + ".corrupt")
    except OSError:
        pass
    return None


def _flock(file: IO[bytes], wait: bool = True) -> bool:
    """Take ``file``'s exclusive lock; False when another process holds it."""
    try:
        import fcntl
    except ImportError:  # (no flock: each process keeps to its own folder)
        return wait
    try:
        fcntl.flock(file.fileno(), fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except OSError:
        return False
    return True

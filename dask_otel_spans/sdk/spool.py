"""The spool: batches an exporter could not deliver, kept as encoded OTLP requests
(the protobuf bytes of ``Export*ServiceRequest``), each bound to its destination
(:class:`~dask_otel_spans.sdk.destination.Destination`), oldest first per
destination; in memory up to one bound, written to a directory once they waited
:data:`SPILL_AFTER` seconds or past the memory bound, up to a second bound; past
both the oldest are dropped and counted.

On disk, each process writes below a folder of its own, ``DIR/<owner>/``, locked
(``flock``) while it lives; one file per batch, written under a temporary name and
renamed, its name carrying its order, item count, checksum, the key of its
destination and its signal; beside it ``<key>.destination``, the destination's
record (no secret). A process that opens the directory takes over the batches of
the destinations it accepts from the folders of owners that ended
(:mod:`~dask_otel_spans.sdk.spooltakeover`); the others stay where they are.
Several processes share a directory without sending one batch twice or to another
destination. The directory is trusted only as far as
:mod:`~dask_otel_spans.sdk.spoolfiles` checks it: a truncated or corrupt file is
set aside (``*.corrupt``) with one line, anything that is not a batch is skipped
with one line, and the rest is sent."""
from __future__ import annotations

import logging
import os
import threading
import time
import uuid
import zlib
from collections import deque
from dataclasses import dataclass
from typing import IO

from dask_otel_spans.sdk.destination import Destination
from dask_otel_spans.sdk.spoolfiles import (
    LOCK,
    MAX_BATCH,
    RECORD,
    BatchName,
    Folder,
    NotPrivate,
    NotRegular,
    batch_name,
    record_key,
)
from dask_otel_spans.sdk.spooltakeover import Accept, Left, Takeover, survey
from dask_otel_spans.wording import counted

logger = logging.getLogger(__name__)

#: Seconds a held batch waits in memory before it is written to the directory: what
#: a SIGKILL of the process can lose of what it held
SPILL_AFTER = 1.0
#: ``otel-spans.spool.directory: auto``: this folder below the user's cache directory
AUTO = "auto"
#: Names said of the entries skipped at open (the count is said whole)
_SKIPPED_SHOWN = 3

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
    """One held batch: the key of the destination it is sent to, its signal, items
    (spans, log records, points), and where it is: ``payload`` in memory, ``name``
    (a file of the spool's own folder) on disk (one of them, or both while read)."""

    destination: str
    signal: str
    items: int
    size: int
    stamp: int
    payload: bytes | None = None
    name: str | None = None
    held_at: float = 0.0


class Spool:
    """Held batches of every destination, bounded, in memory then on disk
    (thread-safe).

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
        #: what :meth:`open` found and left where it was
        self.left: list[Left] = []
        self._queues: dict[str, deque[Entry]] = {}
        self._destinations: dict[str, Destination] = {}
        self._memory = 0
        self._disk = 0
        self._dropped: dict[str, int] = {}
        self._drop_said: set[str] = set()
        self._lock = threading.RLock()
        self._top: Folder | None = None
        self._own: Folder | None = None
        self._own_name = ""
        #: destination records written in the own folder
        self._recorded: set[str] = set()
        self._lock_file: IO[bytes] | None = None
        #: False once a write failed: memory only from then on
        self._writing = True
        self._seq = 0
        self._closed = False

    # -- opening and closing ---------------------------------------------------------

    def open(self, accept: Accept | None = None) -> None:
        """Take a folder of its own in the directory, and from the folders of owners
        that ended the batches ``accept`` gives a destination (oldest first; None:
        none); the rest stays there (:attr:`left`). A directory that cannot be
        written, or that another user owns or may write (it or a folder in it): one
        line, memory only. Opening it again does nothing."""
        if self.directory is None or self._own is not None:
            return
        try:
            top = Folder.top(self.directory)
            others, skipped = survey(top)
            self._own_name = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
            own = top.sub(self._own_name, create=True)
            lock = own.lock(LOCK)
            if lock is None:
                raise OSError(f"cannot lock {own.path}")
        except NotPrivate as e:
            logger.error(
                "dask_otel_spans: the spool directory %s cannot be trusted: %s; batches "
                "that cannot be delivered are held in memory only, up to "
                "otel-spans.spool.max-memory (as ssh does: the directory and every "
                "folder in it must be the user's and not writable by group or others)",
                self.directory, e)
            self.directory = None
            return
        except OSError as e:
            logger.error(
                "dask_otel_spans: cannot write the spool directory %s (%s); batches "
                "that cannot be delivered are held in memory only, up to "
                "otel-spans.spool.max-memory", self.directory, e)
            self.directory = None
            return
        self._top, self._own, self._lock_file = top, own, lock
        self._adopt(Takeover(top, own, accept or _none, self._record, skipped), others)

    def _adopt(self, takeover: Takeover, others: list[str]) -> None:
        """Take over the accepted batches of the folders ``others`` (their owners'
        lock allowing), queue them, and say what was found."""
        for name in others:
            try:
                takeover.folder(name)
            except OSError as e:
                logger.warning("dask_otel_spans: cannot take over the spool folder %s "
                               "(%s)", os.path.join(takeover.top.path, name), e)
        found = sorted(takeover.taken, key=lambda t: t.batch.stamp)
        with self._lock:
            for taken in found:
                self._destinations.setdefault(taken.destination.key, taken.destination)
                self._queue(taken.destination.key).append(Entry(
                    taken.destination.key, taken.batch.signal, taken.batch.items,
                    taken.size, taken.batch.stamp, name=taken.batch.name))
                self._disk += taken.size
        self.left = takeover.left
        if found:
            logger.log(self.adopted_level,
                       "dask_otel_spans: %s left in the spool %s by an export that "
                       "ended: sent first", counted(len(found), "batch", "batches"),
                       self.directory)
        skipped = takeover.skipped
        if skipped:
            logger.warning(
                "dask_otel_spans: skipped %s in the spool %s that %s not a batch the "
                "package wrote (not a regular file or folder, a link, or a name or "
                "size out of bounds): %s", counted(len(skipped), "entry", "entries"),
                self.directory, "is" if len(skipped) == 1 else "are",
                ", ".join(repr(s) for s in skipped[:_SKIPPED_SHOWN])
                + (", ..." if len(skipped) > _SKIPPED_SHOWN else ""))

    def _record(self, destination: Destination) -> None:
        """Write ``destination``'s record in the own folder (once)."""
        assert self._own is not None
        if destination.key not in self._recorded:
            self._own.write(destination.key + RECORD, destination.record())
            self._recorded.add(destination.key)

    def close(self, release: bool = True) -> None:
        """Write what is held in memory to the directory (kept there for the next
        process with it) and, with ``release``, release the folder
        (:meth:`release`); from now on a batch put is written at once."""
        with self._lock:
            self._closed = True
            for queue in self._queues.values():
                for entry in list(queue):
                    if entry.name is None:
                        self._write(entry)
        if release:
            self.release()

    def release(self) -> None:
        """Release the folder (removed when empty): from now on another process
        may take over what it holds. (Not while a batch of it is in flight: were it
        acknowledged, that process would send it again.)"""
        with self._lock:
            if self._lock_file is None:
                return
            own, top = self._own, self._top
            if own is not None and top is not None:
                try:
                    kept = [f for f, _ in own.entries()
                            if f != LOCK and record_key(f) is None]
                except OSError:
                    kept = ["?"]
                if not kept:
                    for key in self._recorded:
                        own.unlink(key + RECORD)
                    self._recorded.clear()
                    own.unlink(LOCK)
                    top.remove(self._own_name)
            self._lock_file.close()
            self._lock_file = None

    # -- holding ---------------------------------------------------------------------

    def put(self, destination: Destination, payload: bytes, items: int) -> None:
        """Hold one encoded request for ``destination`` (the newest of it)."""
        with self._lock:
            self._destinations.setdefault(destination.key, destination)
            entry = Entry(destination.key, destination.signal, items, len(payload),
                          time.time_ns(), payload, held_at=time.monotonic())
            self._queue(destination.key).append(entry)
            self._memory += entry.size
            if self._closed:
                self._write(entry)
            self._bound_memory()

    def spill_due(self, now: float | None = None) -> None:
        """Write the batches that waited :attr:`spill_after` seconds in memory."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if self._own is None or not self._writing:
                return
            for queue in self._queues.values():
                for entry in list(queue):
                    if entry.name is None and now - entry.held_at >= self.spill_after:
                        self._write(entry)

    def oldest(self, destination: str) -> Entry | None:
        """The oldest batch for the destination of key ``destination``, with its
        payload (read back from disk when it is there only); None when none is held.
        Corrupt files are set aside, anything else than a regular file skipped."""
        while True:
            with self._lock:
                queue = self._queue(destination)
                if not queue:
                    return None
                entry = queue[0]
                if entry.payload is not None:
                    return entry
                name = entry.name
            payload = self._read(name) if name is not None else None
            with self._lock:
                if queue and queue[0] is entry:
                    if payload is not None:
                        return Entry(entry.destination, entry.signal, entry.items,
                                     entry.size, entry.stamp, payload, entry.name,
                                     entry.held_at)
                    queue.popleft()
                    self._disk -= entry.size

    def done(self, entry: Entry) -> None:
        """``entry`` was acknowledged (or refused for good): it leaves the spool."""
        with self._lock:
            queue = self._queue(entry.destination)
            for i, held in enumerate(queue):
                if held.stamp == entry.stamp and held.size == entry.size:
                    del queue[i]
                    self._forget(held)
                    return

    def waiting(self, destination: str) -> bool:
        """Whether a batch for the destination of key ``destination`` is held."""
        with self._lock:
            return bool(self._queues.get(destination))

    def figures(self, destination: str) -> dict[str, int]:
        """``held`` (items waiting in memory), ``spooled`` (items waiting on disk
        only) and ``dropped`` (past the bounds) for the destination of key
        ``destination``."""
        with self._lock:
            queue = self._queues.get(destination, ())
            return {
                "held": sum(e.items for e in queue if e.name is None),
                "spooled": sum(e.items for e in queue if e.name is not None),
                "dropped": self._dropped.get(destination, 0),
            }

    def recovered(self, destination: str) -> int:
        """The destination of key ``destination`` answers again: the next drop is
        said again. Items dropped since the last recovery."""
        with self._lock:
            self._drop_said.discard(destination)
            return self._dropped.get(destination, 0)

    # -- inside (under the lock) ---------------------------------------------------------

    def _queue(self, destination: str) -> deque[Entry]:
        return self._queues.setdefault(destination, deque())

    def _forget(self, entry: Entry) -> None:
        if entry.name is None:
            self._memory -= entry.size
        else:
            self._disk -= entry.size
            if self._own is not None:
                self._own.unlink(entry.name)

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
        """Write ``entry`` to the own folder (its payload leaves memory); False when
        it cannot be written."""
        if self._own is None or not self._writing or entry.payload is None:
            return False
        self._seq += 1
        destination = self._destinations[entry.destination]
        name = BatchName.of(entry.stamp, self._seq, entry.items,
                            zlib.crc32(entry.payload), entry.signal, destination.key)
        try:
            self._record(destination)
            self._own.write(name, entry.payload)
        except OSError as e:
            logger.error("dask_otel_spans: cannot write to the spool %s (%s); held "
                         "batches stay in memory", self.directory, e)
            self._writing = False
            return False
        entry.name, entry.payload = name, None
        self._memory -= entry.size
        self._disk += entry.size
        while self._disk > self.max_disk:
            oldest = min((e for q in self._queues.values() for e in q
                          if e.name is not None), key=lambda e: e.stamp)
            self._drop(oldest, "max-disk")
        return True

    def _drop(self, entry: Entry, bound: str) -> None:
        queue = self._queue(entry.destination)
        queue.remove(entry)
        self._forget(entry)
        key = entry.destination
        self._dropped[key] = self._dropped.get(key, 0) + entry.items
        if key not in self._drop_said:
            self._drop_said.add(key)
            logger.error(
                "dask_otel_spans: the spool is full: dropping the oldest held %s (%d "
                "so far; otel-spans.spool.%s raises the bound); logged once per "
                "outage, ExportState.dropped counts them",
                entry.signal, self._dropped[key], bound)

    # -- reading back (outside the lock) -------------------------------------------------

    def _read(self, name: str) -> bytes | None:
        """A spool file's payload; None (one line, the file set aside) when it is
        truncated, corrupt, gone, or not a regular file."""
        own = self._own
        if own is None:
            return None
        batch = batch_name(name)
        try:
            payload = own.read(name, MAX_BATCH)
        except NotRegular as e:
            logger.error("dask_otel_spans: skipped %s in the spool: %s", repr(name), e)
            return None
        except OSError as e:
            logger.error("dask_otel_spans: cannot read the spool file %s (%s); "
                         "skipped", os.path.join(own.path, name), e)
            return None
        if batch is not None and f"{zlib.crc32(payload):08x}" == batch.crc:
            return payload
        logger.error("dask_otel_spans: the spool file %s is truncated or corrupt; "
                     "skipped (kept as %s.corrupt)", os.path.join(own.path, name), name)
        try:
            own.rename(name, own, name + ".corrupt")
        except OSError:
            pass
        return None


def _none(signal: str, key: str | None, destination: Destination | None) -> None:
    """(:data:`~dask_otel_spans.sdk.spooltakeover.Accept`) Nothing is taken over."""
    return None

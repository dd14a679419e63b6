"""Taking over what export processes that ended left in a spool directory: from each
folder whose owner's lock can be taken, the batches of the destinations a process
accepts move into its own folder (with their destination's record); the others
stay where they are, counted; anything that is not a batch the package wrote is
skipped, never followed nor read."""
from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass

from dask_otel_spans.sdk.destination import Destination
from dask_otel_spans.sdk.spoolfiles import (
    LOCK,
    MAX_BATCH,
    MAX_RECORD,
    RECORD,
    BatchName,
    Folder,
    NotRegular,
    batch_name,
    looks_like_a_batch,
    record_key,
)

#: Where the batches of a destination found at open go: ``accept(signal, key,
#: destination)`` (``key`` None: written before batches were bound to a destination;
#: ``destination`` None: its record is missing) gives the destination they are sent
#: to, or None to leave them where they are
Accept = Callable[[str, "str | None", "Destination | None"], "Destination | None"]


@dataclass(frozen=True)
class Left:
    """Batches found and left where they are (not accepted): their signal,
    destination key and destination (None when unknown), how many, their items."""

    signal: str
    key: str | None
    destination: Destination | None
    batches: int
    items: int


@dataclass(frozen=True)
class Taken:
    """A batch moved into the own folder: where it goes (``destination``), what its
    name says, its size."""

    destination: Destination
    batch: BatchName
    size: int


def survey(top: Folder) -> tuple[list[str], list[str]]:
    """The folders in the spool directory ``top``, each checked (raises
    :class:`~dask_otel_spans.sdk.spoolfiles.NotPrivate` for one another user owns
    or may write), and the entries that are not folders (to skip)."""
    folders, skipped = [], []
    for name, st in top.entries():
        if not stat.S_ISDIR(st.st_mode):
            skipped.append(name)
            continue
        try:
            top.sub(name).close()
        except NotRegular:  # (it changed meanwhile)
            skipped.append(name)
            continue
        except FileNotFoundError:
            continue
        folders.append(name)
    return folders, skipped


class Takeover:
    """One process's takeover of the folders of owners that ended.

    Parameters
    ----------
    top, own:
        The spool directory, and the process's own folder in it
    accept:
        Where a destination's batches go (None: they stay)
    record:
        Writes a destination's record in the own folder (once)
    skipped:
        Entries skipped so far (:func:`survey`'s); those met here are added
    """

    def __init__(self, top: Folder, own: Folder, accept: Accept,
                 record: Callable[[Destination], None], skipped: list[str]):
        self.top, self.own = top, own
        self.accept = accept
        self.record = record
        self.skipped = skipped
        #: the batches moved into the own folder
        self.taken: list[Taken] = []
        self._left: dict[tuple[str, str | None], tuple[Destination | None, int, int]] = {}
        self._decided: dict[tuple[str, str | None], Destination | None] = {}
        #: the names in the own folder (new at open: only what was taken)
        self._names: set[str] = set()

    @property
    def left(self) -> list[Left]:
        """The batches left where they were, per signal and destination."""
        return [Left(signal, key, destination, batches, items)
                for (signal, key), (destination, batches, items) in self._left.items()]

    def folder(self, name: str) -> None:
        """Move the accepted batches of the folder ``name`` into the own folder, and
        remove it once nothing is left in it; nothing when its owner runs (its lock
        is held: its batches are its own). Raises ``OSError``."""
        folder = self.top.sub(name)
        lock = folder.lock(LOCK, wait=False)
        if lock is None:
            folder.close()
            return
        try:
            records: dict[str, Destination | None] = {}
            remaining = 0
            for file, st in folder.entries():
                if file == LOCK or record_key(file) is not None:
                    continue
                if file.endswith(".tmp"):  # (a write its owner did not finish)
                    folder.unlink(file)
                    continue
                remaining += not self._file(folder, file, st, records)
            if not remaining:
                for file, _ in folder.entries():
                    if file != LOCK:
                        folder.unlink(file)
                folder.unlink(LOCK)
                self.top.remove(name)
        finally:
            lock.close()
            folder.close()

    def _file(self, folder: Folder, file: str, st: os.stat_result,
              records: dict[str, Destination | None]) -> bool:
        """Move the batch ``file`` of ``folder`` into the own folder when accepted;
        False when it stays."""
        batch = batch_name(file)
        if batch is None or not plausible(batch, st):
            if looks_like_a_batch(file) or not stat.S_ISREG(st.st_mode):
                self.skipped.append(os.path.join(os.path.basename(folder.path), file))
            return False
        destination = (_record_of(folder, batch.key, records)
                       if batch.key is not None else None)
        target = self._target(batch, destination)
        # (a name already taken from another folder stays for the next start)
        if target is None or file in self._names:
            _, batches, items = self._left.get((batch.signal, batch.key), (None, 0, 0))
            self._left[batch.signal, batch.key] = (destination, batches + 1,
                                                   items + batch.items)
            return False
        record = destination or (target if target.key == batch.key else None)
        if record is not None:
            self.record(record)
        folder.rename(file, self.own)
        self.taken.append(Taken(target, batch, st.st_size))
        self._names.add(file)
        return True

    def _target(self, batch: BatchName, destination: Destination | None
                ) -> Destination | None:
        """Where ``batch`` (held for ``destination``, when known) goes, asked once
        per signal and destination; None: it stays."""
        if (batch.signal, batch.key) not in self._decided:
            self._decided[batch.signal, batch.key] = self.accept(
                batch.signal, batch.key, destination)
        return self._decided[batch.signal, batch.key]


def _record_of(folder: Folder, key: str,
               records: dict[str, Destination | None]) -> Destination | None:
    """The destination recorded for ``key`` in ``folder`` (None: no readable,
    well-formed record of that key)."""
    if key not in records:
        try:
            destination = Destination.from_record(folder.read(key + RECORD, MAX_RECORD))
        except OSError:
            destination = None
        records[key] = (destination if destination is not None
                        and destination.key == key else None)
    return records[key]


def plausible(batch: BatchName, st: os.stat_result) -> bool:
    """Whether a file's status fits what its name says: a regular file, within
    :data:`~dask_otel_spans.sdk.spoolfiles.MAX_BATCH`, not claiming more items than
    it has bytes (an item takes one at least)."""
    return (stat.S_ISREG(st.st_mode) and st.st_size <= MAX_BATCH
            and batch.items <= st.st_size)

"""The spool's files in a directory that is trusted only as far as it is checked: as
ssh checks its files, every folder owned by the user and not writable by group or
others; every entry opened without following links (a folder's descriptor, names
relative to it), read only when it is a regular file (opened without blocking, then
checked); every figure a name or a file gives bounded before use."""
from __future__ import annotations

import errno
import os
import re
import stat
import threading
from dataclasses import dataclass
from typing import IO

#: The largest batch file read back (bytes): larger is not a batch the package wrote
#: (an OTLP receiver takes 4 MiB by default)
MAX_BATCH = 256 * 2**20
#: The largest destination record read back (bytes)
MAX_RECORD = 16 * 2**10
#: The most items a batch file's name may claim (and never more than its bytes: each
#: item takes at least one)
MAX_ITEMS = 10**10 - 1
#: Suffix of a folder's destination records: ``<key>.destination``
RECORD = ".destination"
#: The file of a folder its owner locks (``flock``) while it runs
LOCK = ".lock"
#: ``<time ns>-<seq>-<items>-<crc32>[.<destination key>].<signal>.pb`` (without the
#: key: written before batches were bound to their destination)
_NAME = re.compile(
    r"(?P<stamp>[0-9]{20})-(?P<seq>[0-9]{8})-(?P<items>[0-9]{1,10})-(?P<crc>[0-9a-f]{8})"
    r"(?:\.(?P<key>[0-9a-f]{16}))?\.(?P<signal>traces|metrics|logs)\.pb"
)
#: A name that looks like a batch's (whatever its figures)
_BATCH_LIKE = re.compile(r"\.(traces|metrics|logs)\.pb$")
_RECORD_NAME = re.compile(r"(?P<key>[0-9a-f]{16})\.destination")
#: (no following of links, no waiting on a FIFO, no descriptor left to children)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_OPEN = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | _CLOEXEC
#: whether entries can be handled relative to a folder's descriptor (not on Windows)
_AT = (os.open in os.supports_dir_fd and os.listdir in os.supports_fd
       and hasattr(os, "O_DIRECTORY"))


class NotPrivate(OSError):
    """A folder another user owns, or one that group or others may write."""


class NotRegular(OSError):
    """An entry that is not a regular file (a link, a FIFO, a device, a folder)."""


@dataclass(frozen=True)
class BatchName:
    """What a batch file's name says: order, signal, items, checksum, and the key
    of its destination (None: written before batches were bound to one)."""

    name: str
    stamp: int
    signal: str
    items: int
    crc: str
    key: str | None

    @staticmethod
    def of(stamp: int, seq: int, items: int, crc: int, signal: str, key: str) -> str:
        return f"{stamp:020d}-{seq % 10**8:08d}-{items}-{crc:08x}.{key}.{signal}.pb"


def batch_name(name: str) -> BatchName | None:
    """The batch of a file name; None when it is not one (or claims figures beyond
    their bounds)."""
    match = _NAME.fullmatch(name)
    if match is None or int(match["items"]) > MAX_ITEMS:
        return None
    return BatchName(name, int(match["stamp"]), match["signal"], int(match["items"]),
                     match["crc"], match["key"])


def looks_like_a_batch(name: str) -> bool:
    """Whether ``name`` ends as a batch file's does (whether or not it is one)."""
    return bool(_BATCH_LIKE.search(name))


def record_key(name: str) -> str | None:
    """The destination key of a record's file name; None when it is not one."""
    match = _RECORD_NAME.fullmatch(name)
    return match["key"] if match else None


def why_not_private(st: os.stat_result) -> str | None:
    """Why a folder with this status may not hold batches (None: it may): owned by
    another user, or writable by group or others. Where there are no user ids
    (Windows), the folder's access lists are its own matter."""
    geteuid = getattr(os, "geteuid", None)
    if geteuid is None:
        return None
    if st.st_uid != geteuid():
        return f"owned by uid {st.st_uid}, not this user (uid {geteuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (f"writable by group or others (mode "
                f"{stat.S_IMODE(st.st_mode):04o})")
    return None


class Folder:
    """A folder opened without following a link in its place, owner and mode
    checked; its entries are handled relative to it (a swapped path cannot lead
    elsewhere). Thread-safe; its descriptor is closed with :meth:`close` or when it
    is collected."""

    def __init__(self, path: str, fd: int | None):
        #: where it is, for what is said
        self.path = path
        self._fd = fd
        self._closed = False
        #: (the descriptor is never closed while another thread uses it)
        self._guard = threading.Lock()

    @classmethod
    def top(cls, path: str) -> Folder:
        """The spool directory ``path`` (made when missing; a link in its own path is
        the user's choice, its target is what is checked). Raises
        :class:`NotPrivate`, or ``OSError``."""
        os.makedirs(path, mode=0o700, exist_ok=True)
        if not _AT:
            _check(os.stat(path), path)
            return cls(path, None)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
        return cls._checked(path, fd)

    @classmethod
    def _checked(cls, path: str, fd: int) -> Folder:
        try:
            _check(os.fstat(fd), path)
        except OSError:
            os.close(fd)
            raise
        return cls(path, fd)

    def sub(self, name: str, create: bool = False) -> Folder:
        """The folder ``name`` in this one (made when ``create``), not followed when
        it is a link. Raises :class:`NotPrivate`, :class:`NotRegular` (not a folder),
        or ``OSError``."""
        path = os.path.join(self.path, name)
        with self._guard:
            if create:
                at_name, at = self._at(name)
                os.mkdir(at_name, 0o700, **at)
            if not _AT:
                st = os.lstat(path)
                if not stat.S_ISDIR(st.st_mode):
                    raise NotRegular(f"{path} is not a folder")
                _check(st, path)
                return Folder(path, None)
            try:
                fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | _OPEN,
                             dir_fd=self._dir())
            except OSError as e:
                if e.errno in _NOT_TAKEN:
                    raise NotRegular(f"{path} is not a folder (a link?)") from e
                raise
        return self._checked(path, fd)

    def entries(self) -> list[tuple[str, os.stat_result]]:
        """Each entry's name and status (of the entry itself, not a link's target),
        by name; entries gone meanwhile are left out."""
        out = []
        with self._guard:
            names = os.listdir(self._dir() if _AT else self.path)
            for name in sorted(names):
                try:
                    at_name, at = self._at(name)
                    out.append((name, os.stat(at_name, follow_symlinks=False,
                                              **at)))
                except FileNotFoundError:
                    pass
        return out

    def read(self, name: str, limit: int) -> bytes:
        """The content of the regular file ``name``, at most ``limit`` bytes. Raises
        :class:`NotRegular` (anything else, a link too: never followed, never waited
        on), ``OSError`` (also for a file past ``limit``)."""
        fd = self._open(name, os.O_RDONLY)
        with os.fdopen(fd, "rb") as f:
            size = os.fstat(fd).st_size
            if size > limit:
                raise OSError(f"{size} bytes, more than the {limit} a spool file may "
                              "hold")
            data = f.read(limit + 1)
        if len(data) > limit:
            raise OSError(f"more than the {limit} bytes a spool file may hold")
        return data

    def write(self, name: str, data: bytes) -> None:
        """Write ``name`` whole or not at all: under a temporary name, then renamed
        (a link or FIFO in the way is an error, never followed)."""
        temporary = name + ".tmp"
        fd = self._open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            self.rename(temporary, self, name)
        except OSError:
            self.unlink(temporary)
            raise

    def lock(self, name: str, wait: bool = True) -> IO[bytes] | None:
        """The regular file ``name`` (made when missing), locked (``flock``); None
        when another process holds the lock, or it is not a regular file."""
        try:
            fd = self._open(name, os.O_RDWR | os.O_CREAT)
        except OSError:
            return None
        file = os.fdopen(fd, "r+b")
        if not _flock(file, wait):
            file.close()
            return None
        return file

    def rename(self, name: str, to: Folder, new_name: str | None = None) -> None:
        """Move the entry ``name`` (itself, never a link's target) into ``to``."""
        if not _AT:
            os.rename(os.path.join(self.path, name),
                      os.path.join(to.path, new_name or name))
            return
        with self._guard:
            if to is self:
                os.rename(name, new_name or name, src_dir_fd=self._dir(),
                          dst_dir_fd=self._dir())
                return
            with to._guard:
                os.rename(name, new_name or name, src_dir_fd=self._dir(),
                          dst_dir_fd=to._dir())

    def unlink(self, name: str) -> bool:
        """Remove the entry ``name``; False when it cannot be."""
        with self._guard:
            try:
                path, at = self._at(name)
                os.unlink(path, **at)
            except OSError:
                return False
        return True

    def remove(self, name: str) -> bool:
        """Remove the empty folder ``name``; False when it cannot be."""
        with self._guard:
            try:
                path, at = self._at(name)
                os.rmdir(path, **at)
            except OSError:
                return False
        return True

    def close(self) -> None:
        with self._guard:
            self._closed = True
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __del__(self) -> None:
        if self._fd is not None:
            os.close(self._fd)

    # (under the guard)

    def _dir(self) -> int:
        if self._fd is None:
            raise OSError(errno.EBADF, f"{self.path}: closed")
        return self._fd

    def _at(self, name: str) -> tuple[str, dict[str, int]]:
        """``name`` and the folder's descriptor (``os.*(name, dir_fd=...)``), or the
        path where there are none."""
        if self._closed:
            raise OSError(errno.EBADF, f"{self.path}: closed")
        if _AT:
            return name, {"dir_fd": self._dir()}
        return os.path.join(self.path, name), {}

    def _open(self, name: str, flags: int) -> int:
        """A descriptor of the regular file ``name`` (not a link's target, without
        waiting on a FIFO); raises :class:`NotRegular` for anything else."""
        path = os.path.join(self.path, name)
        try:
            with self._guard:
                fd = (os.open(name, flags | _OPEN, 0o600, dir_fd=self._dir()) if _AT
                      else os.open(path, flags | _OPEN, 0o600))
        except OSError as e:
            if e.errno in _NOT_TAKEN:
                raise NotRegular(f"{path} is not a regular file (a link?)") from e
            raise
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise NotRegular(f"{path} is not a regular file")
        return fd


def _check(st: os.stat_result, path: str) -> None:
    why = why_not_private(st)
    if why is not None:
        raise NotPrivate(f"{path} is {why}")


#: errors of an open that met something it was told not to take: a link (ELOOP; EMLINK
#: on BSDs), not a folder (ENOTDIR), a FIFO opened for writing with no reader (ENXIO)
_NOT_TAKEN = frozenset({errno.ELOOP, errno.EMLINK, errno.ENOTDIR, errno.ENXIO})


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

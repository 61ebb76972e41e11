"""Crash-safe file writes for the collection store: temp file, fsync, atomic rename, dir fsync.

A reader (or a process restarted after SIGKILL) sees either the old file or the complete new one,
never a torn write. Temp files carry the `.tmp` suffix so the writer can sweep leftovers on open.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Callable, BinaryIO

from faste_mm.errors import CollectionError
from faste_mm.indexers.crash_points import crash_point

TMP_SUFFIX = ".tmp"


def fsync_dir(path: Path) -> None:
    """Persist a rename: POSIX only guarantees the new directory entry after fsync of the dir."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, write: Callable[[BinaryIO], None], crash_at: str | None = None,
                 mode_of: Path | None = None) -> None:
    """Write `path` through `write(fileobj)` so that it appears complete or not at all.

    The new file keeps the permission bits of the one it replaces (a user's `chmod 600` survives
    every rewrite); a new file takes those of `mode_of` when given (new vector parts follow the
    manifest's). crash_at: a `crash_points` name checked between the write and the rename.
    The temp file is created fresh with O_EXCL | O_NOFOLLOW: a symlink planted at
    its name is removed (unlinking a link never touches its target), never written through.
    """
    tmp = path.with_name(path.name + TMP_SUFFIX)
    mode = _mode(path) if os.path.lexists(path) or mode_of is None else _mode(mode_of)
    try:
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
        with os.fdopen(fd, "wb") as f:
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if crash_at is not None:
            crash_point(crash_at)
        os.replace(tmp, path)
    except OSError as error:
        _unlink_quietly(tmp)
        raise storage_error(path, error) from None
    except BaseException:
        _unlink_quietly(tmp)
        raise
    fsync_dir(path.parent)


def _unlink_quietly(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError:  # a read-only folder: nothing was created there either
        pass


# What a failed write means to the user when it is not damage (errno -> words, what to do).
_NOT_DAMAGE = {
    errno.ENOSPC: ("the disk is full", "free some space and run the command again"),
    errno.EDQUOT: ("the disk quota is used up", "free some space and run the command again"),
    errno.EROFS: ("the file system is read-only", "search and inspect it read-only, or copy the collection "
                                                   "to a writable place"),
    errno.EACCES: ("permission denied", "check that you may write the collection's folder and files"),
    errno.EPERM: ("permission denied", "check that you may write the collection's folder and files"),
}


def storage_error(path: Path, error: OSError) -> CollectionError:
    """The CollectionError for a write that failed: what it is (disk full, read-only, permission)
    and what to do; the collection itself is intact (the last commit stands)."""
    what, advice = _NOT_DAMAGE.get(error.errno, (f"cannot write ({error.strerror or error})",
                                                 "check the disk and try again"))
    return CollectionError(f"{path}: {what}; nothing was changed by this write and the collection is intact. "
                           f"{advice[0].upper()}{advice[1:]}")


def _mode(path: Path) -> int | None:
    """Permission bits of a regular file at `path`; None for anything else or nothing."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return st.st_mode & 0o7777 if stat.S_ISREG(st.st_mode) else None


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Atomic replacement of `path` with `data`."""
    atomic_write(path, lambda f: f.write(data))

"""Crash-safe file writes for the collection store: temp file, fsync, atomic rename, dir fsync.

A reader (or a process restarted after SIGKILL) sees either the old file or the complete new one,
never a torn write. Temp files carry the `.tmp` suffix so the writer can sweep leftovers on open.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Callable, BinaryIO

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
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


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

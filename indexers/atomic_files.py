"""Crash-safe file writes for the collection store: temp file, fsync, atomic rename, dir fsync.

A reader (or a process restarted after SIGKILL) sees either the old file or the complete new one,
never a torn write. Temp files carry the `.tmp` suffix so the writer can sweep leftovers on open.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, BinaryIO

TMP_SUFFIX = ".tmp"


def fsync_dir(path: Path) -> None:
    """Persist a rename: POSIX only guarantees the new directory entry after fsync of the dir."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Write `path` through `write(fileobj)` so that it appears complete or not at all."""
    tmp = path.with_name(path.name + TMP_SUFFIX)
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Atomic replacement of `path` with `data`."""
    atomic_write(path, lambda f: f.write(data))

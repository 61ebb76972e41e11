"""The collection directory itself: which files are a collection's, the one-writer lock (flock on
`collection.lock`), and erasing a collection. Receives a directory path from `Collection`
(create, open, erase); hands back the lock's file descriptor or the names of foreign files.
"""

from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path

from faste_mm.errors import CollectionError
from faste_mm.indexers import faiss_index, parts
from faste_mm.indexers.atomic_files import TMP_SUFFIX
from faste_mm.indexers.manifest import MANIFEST_NAME, read_manifest
from faste_mm.indexers.store import DB_NAME

log = logging.getLogger(__name__)

LOCK_NAME = "collection.lock"
_DB_FILES = (DB_NAME, DB_NAME + "-wal", DB_NAME + "-shm")
OWN_FILES = frozenset({*_DB_FILES, parts.VECTORS_DIR, LOCK_NAME, MANIFEST_NAME, faiss_index.INDEX_NAME})


def acquire_lock(root: Path) -> int:
    """Non-blocking exclusive flock on `root/collection.lock`; the caller holds the fd until it
    closes the collection. Raises CollectionError at once if another process holds it.

    `erase` unlinks the lock file while holding it. A process that opened the old file before
    that unlink can still flock it after erase closes it, and would then hold a lock no other
    process ever asks for; so after locking we check that the path still names the locked file
    (same device and inode) and start over on the file it names now if not.
    """
    path = root / LOCK_NAME
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:  # the directory itself is gone, e.g. erased meanwhile
            raise CollectionError(f"{root}: the collection directory no longer exists (erased by "
                                  f"another process?); create the collection again") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise CollectionError(
                f"{root}: another faste-mm process (pid {holder}) is writing to this collection "
                f"(lock {path} is held); wait for it to finish, or open the collection read-only"
            ) from None
        if _names_file(path, fd):
            break
        os.close(fd)  # we locked a lock file that erase unlinked: not the writer lock
    # The pid is for the error message above only; the flock is what excludes writers.
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def _names_file(path: Path, fd: int) -> bool:
    """True when `path` exists and is the file open as `fd`."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)


def foreign_files(root: Path, *, after_erase: bool = False) -> list[str]:
    """Sorted names in `root` that are not the collection's, which `Collection.create` refuses
    to litter. after_erase: also count temp files as the collection's (`erase` removes them)."""
    return sorted(p.name for p in root.iterdir() if p.name not in OWN_FILES
                  and not (after_erase and p.name.endswith(TMP_SUFFIX) and p.is_file()))


def erase(root: Path, *, for_create: bool = False) -> bool:
    """Delete the collection in `root` under the writer lock; see `Collection.erase`."""
    if not (root / MANIFEST_NAME).is_file():
        return False
    read_manifest(root)  # CollectionError unless it is really ours
    lock_fd = acquire_lock(root)
    try:
        foreign = foreign_files(root, after_erase=True) if for_create else []
        if foreign:
            raise CollectionError(
                f"{root}: holds files that are not the collection's ({', '.join(foreign[:3])}"
                f"{' ...' if len(foreign) > 3 else ''}), so it could not be re-created after erasing; "
                f"nothing was erased. Move those files out, or index into a new collection")
        # Database, then manifest: a crash part-way leaves an empty collection under the old
        # manifest, or leftovers that `create` accepts, never old rows under a new manifest.
        for name in (*_DB_FILES, MANIFEST_NAME, faiss_index.INDEX_NAME):
            (root / name).unlink(missing_ok=True)
        for leftover in [*root.glob("*" + TMP_SUFFIX), *(root / parts.VECTORS_DIR).glob("*")]:
            if leftover.is_file():
                leftover.unlink()
        remove_empty_dir(root / parts.VECTORS_DIR)
        # Last, while still held. Another process may create a new lock file and lock it from
        # now on; that is safe because nothing below touches the collection's files (closing
        # the fd, then removing `root` only if it is empty), and `acquire_lock` rejects this
        # unlinked file if someone who opened it earlier locks it after we close it.
        (root / LOCK_NAME).unlink(missing_ok=True)
    finally:
        os.close(lock_fd)
    remove_empty_dir(root)
    log.info("%s: erased", root)
    return True


def remove_empty_dir(path: Path) -> None:
    try:
        path.rmdir()
    except FileNotFoundError:
        pass
    except OSError:  # not empty: files that are not the collection's stay where they are
        log.info("%s: kept, it holds files that are not the collection's", path)

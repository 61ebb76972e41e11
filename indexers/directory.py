"""The collection directory itself: which files are a collection's, the one-writer lock (flock on
`collection.lock`), and erasing a collection. Receives a directory path from `Collection`
(create, open, erase); hands back the lock's file descriptor or the names of foreign files.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import stat
import weakref
from pathlib import Path

from faste_mm.errors import CollectionError
from faste_mm.indexers import faiss_index, parts
from faste_mm.indexers.atomic_files import TMP_SUFFIX, atomic_write, fsync_dir
from faste_mm.indexers.crash_points import crash_point
from faste_mm.indexers.manifest import MANIFEST_NAME, Manifest, read_manifest
from faste_mm.indexers.database_file import DB_NAME, count_items
from faste_mm.indexers.file_names import SERVER_FILE, WATCH_FILE

log = logging.getLogger(__name__)

LOCK_NAME = "collection.lock"
# A random token written by each `create`: a reader that finds another token (or none) than the
# one it opened knows the collection was erased and made again (`index --reindex`) under it.
GENERATION_NAME = "generation"
_DB_FILES = (DB_NAME, DB_NAME + "-wal", DB_NAME + "-shm")
# Written by `faste-mm serve` while it serves the collection (faste_mm.serving.discovery).
OWN_FILES = frozenset({*_DB_FILES, parts.VECTORS_DIR, LOCK_NAME, MANIFEST_NAME, faiss_index.INDEX_NAME,
                       GENERATION_NAME, SERVER_FILE, WATCH_FILE})
# `erase` first renames manifest.json to this name: from then on the directory is no longer a
# collection, and a later `create` that finds the marker finishes the interrupted erase.
ERASE_MARKER = MANIFEST_NAME + ".erasing" + TMP_SUFFIX
# The temp files of the collection's atomic writes in `root` (a stranger's *.tmp is not ours).
OWN_TEMP_FILES = frozenset({MANIFEST_NAME + TMP_SUFFIX, faiss_index.INDEX_NAME + TMP_SUFFIX,
                            GENERATION_NAME + TMP_SUFFIX, WATCH_FILE + TMP_SUFFIX})


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
            fd = _open_lock_file(path)
        except FileNotFoundError:  # the directory itself is gone, e.g. erased meanwhile
            raise CollectionError(f"{root}: the collection directory no longer exists (erased by "
                                  f"another process?); create the collection again") from None
        except OSError as error:
            if error.errno not in (errno.ELOOP, errno.EISDIR):
                raise CollectionError(f"{path}: cannot open the writer lock ({error.strerror}); "
                                      f"check the folder's permissions") from None
            what = "a symbolic link" if error.errno == errno.ELOOP else "a directory"
            raise CollectionError(f"{path}: is {what}, not faste-mm's lock file; faste-mm never writes "
                                  f"through it. Remove it (it is recreated as a plain file)") from None
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


def _open_lock_file(path: Path) -> int:
    """The lock file opened (created if missing) for `acquire_lock`. A call of its own: a test
    hands back a descriptor opened before an erase, the race that `acquire_lock` must survive."""
    # O_NOFOLLOW: a lock planted as a symlink must not make us truncate its target.
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)


def _names_file(path: Path, fd: int) -> bool:
    """True when `path` exists and is the file open as `fd`."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)


def write_generation(root: Path) -> str:
    """Give a new collection in `root` a fresh generation token (see GENERATION_NAME); returns it."""
    token = os.urandom(8).hex()
    atomic_write(root / GENERATION_NAME, lambda f: f.write(token.encode()))
    return token


def read_generation(root: Path) -> str | None:
    """The generation token of the collection in `root`; None when it has none (erased, or made
    before tokens existed). Read without following a link (the file is ours or ignored)."""
    try:
        fd = os.open(root / GENERATION_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        return os.read(fd, 64).decode("ascii", "replace").strip() or None
    finally:
        os.close(fd)


def is_being_recreated(root: Path) -> bool:
    """Whether `root` holds no complete collection now: an erase in progress (the marker), or no
    manifest (erased, a create not yet complete, or one killed part-way). A reader's failure then
    means "being re-indexed, retry", not damage."""
    return (root / ERASE_MARKER).exists() or not (root / MANIFEST_NAME).is_file()


class HeldGeneration:
    """The generation token a reader opened, its file held open so that checking it is one stat: the
    token is written by an atomic rename (a new inode each time) and an inode cannot be reused while
    open, so the path names the held file exactly while the token is the same. Saves a reader's
    search an open, read and close (~40 us) on a collection that was not re-created."""

    def __init__(self, root: Path) -> None:
        self.path = root / GENERATION_NAME
        self._path_str = os.fspath(self.path)
        self.token: str | None = None
        self._inode: tuple[int, int] | None = None
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return  # none (made before tokens existed): current while none appears
        self._close = weakref.finalize(self, os.close, fd)
        self.token = os.read(fd, 64).decode("ascii", "replace").strip() or None
        held = os.fstat(fd)
        self._inode = (held.st_dev, held.st_ino)

    def is_current(self) -> bool:
        """Whether `root` still holds the token file read (or, holding none, still has none)."""
        try:
            st = os.stat(self._path_str, follow_symlinks=False)  # a str: a Path's __fspath__ costs ~10% of it
        except OSError:
            return self._inode is None
        return (st.st_dev, st.st_ino) == self._inode

    def close(self) -> None:
        if self._inode is not None:
            self._close()


def foreign_files(root: Path, *, after_erase: bool = False) -> list[str]:
    """Sorted names in `root` that are not the collection's, which `Collection.create` refuses
    to litter. after_erase: also count temp files as the collection's (`erase` removes them)."""
    return sorted(p.name for p in root.iterdir() if p.name not in OWN_FILES
                  and not (after_erase and p.name in OWN_TEMP_FILES | {ERASE_MARKER} and _is_regular(p)))


def refuse_links(root: Path) -> None:
    """CollectionError when one of the collection's own names in `root` is a symbolic link: a
    writer would write or delete through it, outside the collection (a crafted or shared folder)."""
    for name in sorted(OWN_FILES):
        if (root / name).is_symlink():
            raise CollectionError(
                f"{root / name}: is a symbolic link to {os.readlink(root / name)}; a collection's files "
                f"must be its own (faste-mm never writes or deletes through a link). Replace the link "
                f"by the real {'folder' if name == parts.VECTORS_DIR else 'file'}, or index into a new collection")


def _is_regular(path: Path) -> bool:
    """True for a regular file, False for links (even to files), folders and anything else."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def _remove_written_files(root: Path) -> None:
    """Unlink what a collection writes, and nothing else: its database, index, temp files and
    part files (regular files only; a link is never followed, a stranger's file never matched)."""
    for name in (*_DB_FILES, faiss_index.INDEX_NAME, GENERATION_NAME, WATCH_FILE):
        if _is_regular(root / name):
            (root / name).unlink()
    vectors = root / parts.VECTORS_DIR
    own = [root / name for name in OWN_TEMP_FILES]
    if vectors.is_dir() and not vectors.is_symlink():
        own += [p for p in vectors.iterdir() if parts.is_part_file(p.name)]
    for path in own:
        if _is_regular(path):
            path.unlink()
    remove_empty_dir(vectors)


def refuse_database_behind(root: Path, manifest: Manifest, state: dict[str, int]) -> None:
    """CollectionError when manifest.json describes parts that meta.sqlite has never committed.

    The manifest is saved after the commits it describes, so its index key (epoch, highest part)
    can never be ahead of the database's counters; when it is, the database was replaced by an
    older copy or lost its -wal file, and the orphan sweep would delete vectors it still needs."""
    epoch, next_part = state.get("epoch", 0), state.get("next_part", 0)
    behind = manifest.index_epoch > epoch or (
        manifest.index_epoch == epoch and manifest.index_max_part >= next_part)
    if behind:
        raise CollectionError(
            f"{root / DB_NAME}: is older than {MANIFEST_NAME}: the manifest's index covers part "
            f"{manifest.index_max_part} of compaction epoch {manifest.index_epoch}, but the database has "
            f"committed parts only below {next_part} (epoch {epoch}); it was replaced by an older copy or "
            f"lost its {DB_NAME}-wal file. Nothing was changed. Put back the newest {DB_NAME} (and its "
            f"-wal file); to start over instead, move the folder aside and index into a new collection")


def complete_interrupted_create(root: Path) -> None:
    """Make a directory without manifest.json ready for `Collection.create` (caller holds the
    lock): finish an interrupted erase, or drop the temp files of an interrupted create. Raises
    CollectionError for a directory that holds a collection's data but lost its manifest: that is
    damage, and erasing it would destroy vectors the user may still restore."""
    refuse_links(root)
    if (root / ERASE_MARKER).exists():
        log.warning("%s: finishing an erase that was interrupted", root)
        _remove_written_files(root)
        (root / ERASE_MARKER).unlink()
        (root / parts.VECTORS_DIR).mkdir(exist_ok=True)
        return
    vectors = root / parts.VECTORS_DIR
    n_parts = sum(1 for p in vectors.iterdir() if parts.is_part_file(p.name)) if vectors.is_dir() else 0
    n_items = count_items(root / DB_NAME)
    if n_parts or n_items:
        raise CollectionError(
            f"{root}: {MANIFEST_NAME} is missing, but the folder holds a collection's data ({n_items} item "
            f"rows, {n_parts} vector files); nothing was changed. Restore {MANIFEST_NAME} from a backup, "
            f"or delete the folder yourself to index into it from scratch")
    remove_temp_files(root)  # e.g. manifest.json.tmp of a create killed before its rename


def remove_temp_files(root: Path) -> None:
    """Unlink the collection's temp files in `root` (torn atomic writes) if they are regular
    files; links and other *.tmp files are left alone."""
    for name in OWN_TEMP_FILES:
        if _is_regular(root / name):
            (root / name).unlink(missing_ok=True)


def erase(root: Path, *, for_create: bool = False) -> bool:
    """Delete the collection in `root` under the writer lock; see `Collection.erase`."""
    if not (root / MANIFEST_NAME).is_file():
        return False
    read_manifest(root)  # CollectionError unless it is really ours
    lock_fd = acquire_lock(root)
    try:
        refuse_links(root)
        foreign = foreign_files(root, after_erase=True) if for_create else []
        if foreign:
            raise CollectionError(
                f"{root}: holds files that are not the collection's ({', '.join(foreign[:3])}"
                f"{' ...' if len(foreign) > 3 else ''}), so it could not be re-created after erasing; "
                f"nothing was erased. Move those files out, or index into a new collection")
        # The manifest becomes the erase marker first: a crash part-way leaves a folder that no
        # reader takes for a collection and that `create` recognises and finishes erasing.
        os.replace(root / MANIFEST_NAME, root / ERASE_MARKER)
        fsync_dir(root)
        crash_point("erase-after-marker")
        _remove_written_files(root)
        (root / ERASE_MARKER).unlink()
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

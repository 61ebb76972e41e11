"""Opening a collection directory: the checks and file work behind `Collection.create` and
`Collection.open` (validating the manifest, the writer lock, schema migration, sweeping what a
crash left). Receives a path and settings; hands back (manifest, store, lock fd) for `Collection`.
"""

from __future__ import annotations

import os
from pathlib import Path

from faste_mm.errors import CollectionError, ConfigError
from faste_mm.indexers import directory, faiss_index, parts
from faste_mm.indexers.directory import acquire_lock
from faste_mm.indexers.manifest import MANIFEST_NAME, Manifest, read_manifest, settings_mismatch, write_manifest
from faste_mm.indexers.store import MetaStore

Opened = tuple[Manifest, MetaStore, "int | None"]


def is_existing(root: Path, manifest: Manifest, exist_ok: bool) -> bool:
    """Whether `root` already holds a collection to open instead of creating one (exist_ok); raises
    CollectionError when it does and `exist_ok` is False, or when `root` cannot take a new one."""
    faiss_index.validate_factory(manifest.index_type, manifest.dim, manifest.vectors)
    if (root / MANIFEST_NAME).exists():
        if not exist_ok:
            raise CollectionError(f"{root}: a collection already exists here; open it, or "
                                  f"pass exist_ok=True to add to it")
        return True
    if root.exists() and not root.is_dir():
        raise CollectionError(f"{root}: is a file, not a collection directory; choose a new path")
    if root.exists():
        # A directory left by an interrupted create or erase holds only our files (temp files
        # included); anything else means the user pointed us at the wrong folder, which we
        # must not litter.
        foreign = directory.foreign_files(root, after_erase=True)
        if foreign:
            raise CollectionError(f"{root}: directory is not empty and not a collection "
                                  f"(contains {foreign[:3]}); choose a new path")
    return False


def create_files(root: Path, manifest: Manifest) -> Opened | None:
    """Make the collection's files under the writer lock, the manifest last (its presence marks a
    complete collection). None when another process completed a create meanwhile."""
    root.mkdir(parents=True, exist_ok=True)
    lock_fd = acquire_lock(root)
    try:
        if (root / MANIFEST_NAME).exists():  # another process completed a create meanwhile
            os.close(lock_fd)
            lock_fd = None
            return None
        directory.complete_interrupted_create(root)
        (root / parts.VECTORS_DIR).mkdir(exist_ok=True)
        store = MetaStore(root, writable=True, create=True)
        directory.write_generation(root)
        manifest = manifest.replace(index_factory=None, index_epoch=-1, index_max_part=-1,
                                    counts=store.counts())
        write_manifest(root, manifest, crash_at="create-before-manifest")
    except BaseException:
        if lock_fd is not None:
            os.close(lock_fd)
        raise
    return manifest, store, lock_fd


def open_files(root: Path, writable: bool, expect: Manifest | None) -> Opened:
    """Read and check the manifest (against `expect`), take the writer lock (writable), open the
    database (migrating an older schema) and sweep orphaned parts and torn temp files."""
    manifest = read_manifest(root)
    try:
        faiss_index.validate_factory(manifest.index_type, manifest.dim)
    except ConfigError as error:  # a hand-edited or damaged manifest: its index could never be built
        raise CollectionError(f"{root / MANIFEST_NAME}: {error}. Fix \"index\": {{\"type\": ...}} there, or "
                              f"restore the file from a backup") from None
    if expect is not None:
        errors = manifest.compatibility_errors(expect)
        if errors:
            raise settings_mismatch(root, errors)
    lock_fd = acquire_lock(root) if writable else None
    store = None
    try:
        if writable:
            directory.refuse_links(root)
        store = MetaStore(root, writable=writable)
        state = store.state()
        directory.refuse_database_behind(root, manifest, state)
        if writable:
            parts.remove_orphans(root, store.named_parts(), state["next_part"], state.get("retired_below", 0))
            directory.remove_temp_files(root)  # torn index/manifest writes
    except BaseException:
        if store is not None:
            store.close()
        if lock_fd is not None:
            os.close(lock_fd)
        raise
    return manifest, store, lock_fd

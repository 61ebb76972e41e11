"""Vector part files under `vectors/`: append-only, written atomically, referenced by SQLite.

A part is `part-NNNNNN.npy` (vectors [n, d], float16 or float32) plus `part-NNNNNN.ids.npy`
(int64 [n]). Both are renamed into place BEFORE the SQLite transaction that references the part
commits, so a part on disk that SQLite does not list is an orphan of a crash and may be removed.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from pathlib import Path

import numpy as np

from faste_mm.errors import CollectionError
from faste_mm.indexers.atomic_files import TMP_SUFFIX, atomic_write

log = logging.getLogger(__name__)

VECTORS_DIR = "vectors"
_PART_RE = re.compile(r"^part-(\d{6,})\.(ids\.)?npy$")


def vectors_path(root: Path, part: int) -> Path:
    return root / VECTORS_DIR / f"part-{part:06d}.npy"


def ids_path(root: Path, part: int) -> Path:
    return root / VECTORS_DIR / f"part-{part:06d}.ids.npy"


def write_part(root: Path, part: int, vectors: np.ndarray, ids: np.ndarray, dtype: str,
               mode_of: Path | None = None) -> None:
    """Durably write part `part`: ids first, then vectors, each temp + fsync + rename.
    mode_of: a file whose permission bits the part files get (see `atomic_write`)."""
    assert vectors.ndim == 2 and len(vectors) == len(ids)
    atomic_write(ids_path(root, part), lambda f: np.save(f, ids.astype(np.int64, copy=False)), mode_of=mode_of)
    atomic_write(vectors_path(root, part),
                 lambda f: np.save(f, vectors.astype(dtype, copy=False)), mode_of=mode_of)


class PartMissing(CollectionError):
    """A part file SQLite lists is not on disk: damage, unless a compact replaced the part after
    the reader's snapshot began (the reader then retries on the newer parts)."""


def _load(path: Path, part: int, **options) -> np.ndarray:
    """np.load of one file of a part; PartMissing when it is gone (a compact may have replaced
    the part under a reader), CollectionError when it cannot be read."""
    try:
        return np.load(path, **options)
    except FileNotFoundError as e:
        raise PartMissing(f"{path}: cannot read vector part {part} ({e.strerror}); the collection is "
                          f"damaged — re-index it with `--reindex`") from None
    except OSError as e:
        raise CollectionError(f"{path}: cannot read vector part {part} ({e.strerror or e}); check that "
                              f"you may read the collection's files, and the disk") from None
    except ValueError as e:
        # numpy's words for bytes that are no .npy array advise allow_pickle, never to be used here.
        why = "it holds no numeric .npy array: garbage or foreign bytes" if "pickle" in str(e) else str(e)
        raise CollectionError(f"{path}: cannot read vector part {part} ({why}); the collection is damaged — "
                              f"restore the file from a backup, or re-index with `--reindex`") from None


def read_ids(root: Path, part: int, n_rows: int) -> np.ndarray:
    """The item ids [n] int64 of one part (small: no vectors are read)."""
    path = ids_path(root, part)
    ids = _load(path, part)
    if ids.shape != (n_rows,):
        raise CollectionError(f"{path}: part {part} has ids {ids.shape}, expected ({n_rows},); the "
                              f"collection is damaged — re-index it with `--reindex`")
    return ids


def read_part(root: Path, part: int, n_rows: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """(vectors [n, d] memory-mapped in the stored dtype, ids [n] int64) of one part.

    Raises CollectionError when a part SQLite references is missing or has the wrong shape:
    the collection is damaged and only re-indexing can restore the lost vectors.
    """
    path = vectors_path(root, part)
    vectors = _load(path, part, mmap_mode="r")
    if vectors.shape != (n_rows, dim):
        raise CollectionError(f"{path}: part {part} has vectors {vectors.shape}, expected ({n_rows}, {dim}); "
                              f"the collection is damaged — re-index it with `--reindex`")
    return vectors, read_ids(root, part, n_rows)


def remove_part(root: Path, part: int) -> None:
    vectors_path(root, part).unlink(missing_ok=True)
    ids_path(root, part).unlink(missing_ok=True)


def is_part_file(name: str) -> bool:
    """True for the names a collection writes under vectors/ (parts and their temp files)."""
    return bool(_PART_RE.match(name.removesuffix(TMP_SUFFIX)))


def remove_orphans(root: Path, listed: set[int], next_part: int, retired_below: int) -> list[Path]:
    """Delete temp files and the part files no commit references; return what was removed.

    listed: parts that meta.sqlite's parts table or an item row names (always kept).
    next_part: the first part number no commit has used; a file at or above it was written by an
    add or compact that never committed. retired_below: a compact moved every row of the parts
    below this number into newer parts, so an unlisted one is a leftover of that compact. Any
    other unlisted part file (below next_part, not retired) contradicts the database and is kept.

    Only regular files with the names parts are written under are candidates: a symlink (even
    to a part) or a stranger's file is never deleted. Only a writer holding the collection lock
    may call this: another writer's freshly renamed, not-yet-committed part would look like an
    orphan. Raises CollectionError when vectors/ is gone while SQLite lists parts.
    """
    folder = root / VECTORS_DIR
    if not folder.is_dir():
        if listed:
            raise CollectionError(
                f"{folder}: the vectors folder is missing, but meta.sqlite lists {len(listed)} vector "
                f"parts; the stored vectors are lost. Restore the folder from a backup, or re-index with "
                f"`--reindex`")
        folder.mkdir()
    removed, kept = [], set()
    for path in sorted(folder.iterdir()):
        m = _PART_RE.match(path.name)
        if not is_part_file(path.name) or not stat.S_ISREG(os.lstat(path).st_mode):
            continue
        if path.name.endswith(TMP_SUFFIX):
            path.unlink(missing_ok=True)
            removed.append(path)
            continue
        part = int(m.group(1))
        if part in listed:
            continue
        if part >= next_part or part < retired_below:
            path.unlink(missing_ok=True)
            removed.append(path)
        else:
            kept.add(part)
    if removed:
        log.warning("%s: removed %d orphaned vector files left by an interrupted write",
                    root, len(removed))
    if kept:
        log.warning("%s: kept vector parts %s that meta.sqlite does not list (a database older than the "
                    "parts?); they are never deleted automatically", root, sorted(kept))
    return removed

"""Vector part files under `vectors/`: append-only, written atomically, referenced by SQLite.

A part is `part-NNNNNN.npy` (vectors [n, d], float16 or float32) plus `part-NNNNNN.ids.npy`
(int64 [n]). Both are renamed into place BEFORE the SQLite transaction that references the part
commits, so a part on disk that SQLite does not list is an orphan of a crash and may be removed.
"""

from __future__ import annotations

import logging
import re
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


def write_part(root: Path, part: int, vectors: np.ndarray, ids: np.ndarray, dtype: str) -> None:
    """Durably write part `part`: ids first, then vectors, each temp + fsync + rename."""
    assert vectors.ndim == 2 and len(vectors) == len(ids)
    atomic_write(ids_path(root, part), lambda f: np.save(f, ids.astype(np.int64, copy=False)))
    atomic_write(vectors_path(root, part),
                 lambda f: np.save(f, vectors.astype(dtype, copy=False)))


def read_part(root: Path, part: int, n_rows: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """(vectors [n, d] memory-mapped in the stored dtype, ids [n] int64) of one part.

    Raises CollectionError when a part SQLite references is missing or has the wrong shape:
    the collection is damaged and only re-indexing can restore the lost vectors.
    """
    vpath, ipath = vectors_path(root, part), ids_path(root, part)
    try:
        vectors = np.load(vpath, mmap_mode="r")
        ids = np.load(ipath)
    except (OSError, ValueError) as e:
        raise CollectionError(f"{vpath}: cannot read vector part {part} ({e}); the collection is "
                              f"damaged — re-index it with `--reindex`") from None
    if vectors.shape != (n_rows, dim) or ids.shape != (n_rows,):
        raise CollectionError(
            f"{vpath}: part {part} has vectors {vectors.shape} and ids {ids.shape}, expected "
            f"({n_rows}, {dim}) and ({n_rows},); the collection is damaged — re-index it with "
            f"`--reindex`")
    return vectors, ids


def remove_part(root: Path, part: int) -> None:
    vectors_path(root, part).unlink(missing_ok=True)
    ids_path(root, part).unlink(missing_ok=True)


def remove_orphans(root: Path, committed: set[int]) -> list[Path]:
    """Delete temp files and part files SQLite does not reference; return what was removed.

    Only a writer holding the collection lock may call this: another writer's freshly renamed,
    not-yet-committed part would look like an orphan.
    """
    removed = []
    for path in sorted((root / VECTORS_DIR).iterdir()):
        m = _PART_RE.match(path.name)
        if path.name.endswith(TMP_SUFFIX) or (m and int(m.group(1)) not in committed):
            path.unlink(missing_ok=True)
            removed.append(path)
    if removed:
        log.warning("%s: removed %d orphaned vector files left by an interrupted write",
                    root, len(removed))
    return removed

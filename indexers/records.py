"""Plain data handed into and out of a collection: item records, file stats, scan plans, info,
and the checks a batch of rows (vectors + records) passes before it is stored.

Nothing here touches disk except `open_regular` and `content_hash`, which streams a file through
sha256 so that identical content already in a collection can be found without re-embedding it.
"""

from __future__ import annotations

import hashlib
import math
import os
import stat
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from faste_mm.errors import ConfigError, InputError
from faste_mm.indexers.facts import ItemFacts



class Status(str, Enum):
    """An item row's state: OK has a vector and is searchable, FAILED records why a file could not
    be embedded (no vector), DELETED is a tombstone whose vector stays until `compact`. The values
    are what meta.sqlite stores (its CHECK constraint names the same three)."""

    OK = "ok"
    FAILED = "failed"
    DELETED = "deleted"

    def __str__(self) -> str:
        return self.value


STATUSES = tuple(status.value for status in Status)
_HASH_CHUNK_BYTES = 1 << 20
_NORM_TOLERANCE = 1e-2


@dataclass(frozen=True, slots=True)
class ItemRecord:
    """One stored item: a text, an image, an image+text pair or one page of a document.

    `uri` and `page` identify the item ((uri, page) is unique among live rows); `size`/`mtime`
    are the source file's stat used by incremental scans; `metadata` is any JSON-serialisable dict.
    `id`, `status`, `added_at` are filled in by the collection; `error` is set on failed rows.
    `dev`/`ino`: the identity (device, inode) of the file read when it was indexed; a reader at
    request time reads it again only while it is the same file (`retrieval.stored_files`). None
    for items without a file, and for files indexed before identities were recorded.
    `text`: the item's own words for lexical search (a text file's text, the text of an image+text
    item, a PDF page's text layer); written to the lexical index with the row, not read back.
    `facts`: typed metadata read from the file (date taken, camera, place...: `ItemFacts`), kept
    beside the row and fed to the lexical index; None when none was read.
    """

    uri: str
    modality: str
    page: int | None = None
    size: int | None = None
    mtime: float | None = None
    content_hash: str | None = None
    metadata: Mapping[str, Any] | None = None
    error: str | None = None
    id: int | None = None
    status: Status = Status.OK
    added_at: float | None = None
    text: str | None = None
    dev: int | None = None
    ino: int | None = None
    facts: ItemFacts | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.uri, str) or not self.uri:
            raise InputError(f"ItemRecord.uri must be a non-empty string, got {self.uri!r}")
        if not isinstance(self.modality, str) or not self.modality:
            raise InputError(f"{self.uri}: ItemRecord.modality must be a non-empty string, "
                             f"got {self.modality!r}")
        if self.page is not None and (not isinstance(self.page, int) or self.page < 0):
            raise InputError(f"{self.uri}: ItemRecord.page must be None or an int >= 0, "
                             f"got {self.page!r}")
        if self.status not in STATUSES:
            raise InputError(f"{self.uri}: ItemRecord.status must be one of {STATUSES}, "
                             f"got {self.status!r}")
        object.__setattr__(self, "status", Status(self.status))  # as read from SQLite: a str

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["metadata"] = dict(self.metadata) if self.metadata is not None else None
        d["facts"] = self.facts.to_dict() if self.facts is not None else None
        del d["text"]  # input for the lexical index only (never read back)
        return d


@dataclass(frozen=True, slots=True)
class FileStat:
    """What an incremental scan compares: a file's uri, size in bytes and mtime in seconds; and
    its identity (device, inode: of the file a link leads to), recorded with its items."""

    uri: str
    size: int
    mtime: float
    dev: int | None = None
    ino: int | None = None

    def __post_init__(self) -> None:
        if not self.uri:
            raise ConfigError(f"FileStat.uri must be a non-empty string, got {self.uri!r}")
        if self.size < 0:
            raise ConfigError(f"FileStat.size for {self.uri} must be >= 0, got {self.size}")
        if not math.isfinite(self.mtime):
            raise ConfigError(f"FileStat.mtime for {self.uri} must be finite, got {self.mtime}")

    @classmethod
    def of(cls, path: str | Path) -> "FileStat":
        """Stat a file on disk; the uri is its resolved absolute path."""
        p = Path(path).resolve()
        st = p.stat()
        return cls(uri=str(p), size=st.st_size, mtime=st.st_mtime, dev=st.st_dev, ino=st.st_ino)


@dataclass(frozen=True, slots=True)
class ScanPlan:
    """Result of `Collection.plan_scan`: which files to embed, skip, or tombstone."""

    new: tuple[FileStat, ...]
    changed: tuple[FileStat, ...]
    unchanged: tuple[FileStat, ...]
    vanished: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "new": [asdict(f) for f in self.new],
            "changed": [asdict(f) for f in self.changed],
            "unchanged": [asdict(f) for f in self.unchanged],
            "vanished": list(self.vanished),
        }


@dataclass(frozen=True, slots=True)
class CollectionInfo:
    """Summary of a collection for `faste-mm info` (counts, index, bytes on disk, failures, and
    the removed paths later scans skip)."""

    path: str
    model_id: str
    dim: int
    vector_dtype: str
    n_ok: int
    n_failed: int
    n_deleted: int
    n_parts: int
    index_type: str
    index_factory: str | None
    index_is_current: bool
    size_bytes: int
    failures: tuple[ItemRecord, ...] = field(default=())
    exclusions: tuple[str, ...] = field(default=())
    vectors: str = "float32"  # index precision (Manifest.vectors)
    keep: str = "float"  # copy kept on disk for rescoring (Manifest.keep)
    facts: Mapping[str, Any] = field(default_factory=dict)  # the items' facts in numbers (fact_rows.summary)

    def to_dict(self) -> dict[str, Any]:
        d = {name: getattr(self, name) for name in self.__dataclass_fields__}
        d["facts"] = dict(self.facts)
        d["failures"] = [r.to_dict() for r in self.failures]
        d["exclusions"] = list(self.exclusions)
        return d


# Files up to this size are hashed whole (sha256 of the bytes, the hash every collection has
# stored so far). A larger one (a video, or a huge sparse file of which `index` reads 1 MiB) is
# hashed by what a reader can tell apart cheaply: its first and last HASH_EDGE_BYTES, its size
# and its mtime, marked "edges:" so it never equals a whole-file hash. Two such files are taken
# for the same content only with equal size, mtime and edges.
HASH_WHOLE_MAX_BYTES = 64 << 20
HASH_EDGE_BYTES = 4 << 20


def open_regular(path: str | Path):
    """`path` opened for binary reading, only if it is a regular file. O_NONBLOCK: a file
    replaced by a FIFO after the scan must not block the writer in open() forever; the type is
    checked on the opened descriptor, so no swap after the check can slip through. InputError
    (naming the path and what it is) for anything else; OSError as open() raises it."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(
                mode) else "a socket" if stat.S_ISSOCK(mode) else "a folder" if stat.S_ISDIR(mode) else "not a file"
            raise InputError(f"{path}: is {kind}, not a regular file (replaced since the scan?); only files are read")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def content_hash(path: str | Path) -> str:
    """sha256 hex of a regular file's bytes, read in 1 MiB chunks (constant memory for large PDFs);
    for files over HASH_WHOLE_MAX_BYTES, "edges:" + sha256 of size, mtime and the first and last
    HASH_EDGE_BYTES (see above). InputError when `path` is not a regular file (`open_regular`)."""
    h = hashlib.sha256()
    with open_regular(path) as f:
        st = os.fstat(f.fileno())
        if st.st_size <= HASH_WHOLE_MAX_BYTES:
            while chunk := f.read(_HASH_CHUNK_BYTES):
                h.update(chunk)
            return h.hexdigest()
        h.update(f"{st.st_size}\0{st.st_mtime_ns}\0".encode())
        h.update(f.read(HASH_EDGE_BYTES))
        f.seek(st.st_size - HASH_EDGE_BYTES)
        h.update(f.read(HASH_EDGE_BYTES))
    return "edges:" + h.hexdigest()


def repeated_key(records: Sequence[ItemRecord]) -> tuple[int, int] | None:
    """The rows (first, second) of the first (uri, page) that `records` holds twice, else None."""
    first: dict[tuple[str, int | None], int] = {}
    for i, r in enumerate(records):
        j = first.setdefault((r.uri, r.page), i)
        if j != i:
            return j, i
    return None


def check_unique(records: Sequence[ItemRecord], where: object) -> None:
    """InputError naming the first (uri, page) that one batch of `records` holds twice."""
    repeated = repeated_key(records)
    if repeated is not None:
        r = records[repeated[1]]
        raise InputError(f"{where}: {r.uri} page {r.page} appears twice in one batch (rows "
                         f"{repeated[0]} and {repeated[1]}); each (uri, page) may be added once")


def check_rows(vectors: np.ndarray, records: Sequence[ItemRecord], dim: int, normalized: bool,
               where: object) -> np.ndarray:
    """`vectors` [n, dim] as float32, after checking them with their `records` for a collection
    (`where`, named in messages) of width `dim`: one finite row per record, unit-norm when
    `normalized`, each (uri, page) once. Raises InputError naming the record."""
    if not isinstance(vectors, np.ndarray) or vectors.ndim != 2:
        raise InputError(f"{where}: vectors must be a 2-D numpy array [n, {dim}], got "
                         f"{getattr(vectors, 'shape', type(vectors).__name__)}")
    if vectors.shape != (len(records), dim):
        raise InputError(f"{where}: vectors have shape {vectors.shape}, expected "
                         f"({len(records)}, {dim}) for {len(records)} records")
    vectors = np.asarray(vectors, dtype=np.float32)
    bad = ~np.isfinite(vectors).all(axis=1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InputError(f"{where}: vector for {records[i].uri} (row {i}) has NaN/inf")
    if normalized and len(vectors):
        norms = np.linalg.norm(vectors, axis=1)
        off = np.abs(norms - 1.0) > _NORM_TOLERANCE
        if off.any():
            i = int(np.flatnonzero(off)[0])
            raise InputError(f"{where}: vector for {records[i].uri} (row {i}) has norm "
                             f"{norms[i]:.4f}, expected 1 (the collection stores "
                             f"L2-normalised vectors); normalise before adding")
    check_unique(records, where)
    return vectors

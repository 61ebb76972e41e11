"""Duplicates of a collection: exact copies (the same content hash) and near-duplicates (resized,
re-encoded, slightly cropped copies, burst shots) whose vectors score at least a threshold, found by
FAISS range search over the collection's own index, joined into connected components, each with a
suggested keeper. Receives an open `Collection`; hands back a `DuplicateReport`. Reads only: it
never deletes, moves or changes a file or an item.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from faste_mm.errors import ConfigError, FasteError
from faste_mm.indexers import Collection, ItemRecord

log = logging.getLogger(__name__)

# Cosine at or above which two items count as near-duplicates. Copies of one photo resized or
# re-encoded as JPEG score ~0.97-0.99 with Qwen3-VL-Embedding; distinct shots of one scene lower.
DEFAULT_THRESHOLD = 0.95
# Live vectors sent to one range search (bounded memory: one chunk of queries and its matches).
QUERY_CHUNK_ROWS = 4096
# Stored vectors multiplied with one chunk of queries at a time by a flat scan ([4096, 16384] scores).
SCAN_BLOCK_ROWS = 16_384


@dataclass(frozen=True, slots=True)
class DuplicateItem:
    """One member of a group: the item, its pixel size (None when unknown: not an image, or its
    header is unreadable), its date (seconds since the epoch; `date_source` says from what) and its
    cosine to the group's keeper (1.0 for the keeper and for exact copies)."""

    id: int
    uri: str
    page: int | None
    content_hash: str | None
    width: int | None
    height: int | None
    date: float | None
    date_source: str | None
    score: float

    @property
    def pixels(self) -> int:
        return (self.width or 0) * (self.height or 0)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class DuplicateGroup:
    """Items that duplicate each other: `kind` "exact" (one content hash) or "near" (vectors scoring
    >= the threshold, directly or through other members); `items[0]` is the suggested keeper (largest
    resolution, then earliest date, then the shortest path), the others follow by score."""

    kind: str
    items: tuple[DuplicateItem, ...]

    @property
    def keeper(self) -> DuplicateItem:
        return self.items[0]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "keeper": self.keeper.uri, "items": [item.to_dict() for item in self.items]}


@dataclass(frozen=True, slots=True)
class DuplicateReport:
    """`Retriever.duplicates`: the groups, largest first; items compared; the threshold; seconds."""

    groups: tuple[DuplicateGroup, ...]
    n_items: int
    threshold: float
    seconds: float

    @property
    def n_redundant(self) -> int:
        """Items a user could drop keeping one per group."""
        return sum(len(group.items) - 1 for group in self.groups)

    def to_dict(self) -> dict[str, Any]:
        return {"threshold": self.threshold, "n_items": self.n_items, "n_groups": len(self.groups),
                "n_redundant": self.n_redundant, "seconds": self.seconds,
                "groups": [group.to_dict() for group in self.groups]}


def check_threshold(threshold: object) -> float:
    """`threshold` as a float in (0, 1]; ConfigError naming the value otherwise."""
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0.0 < threshold <= 1.0 \
            or math.isnan(threshold):
        raise ConfigError(f"duplicates: threshold is a cosine in (0, 1] (1 = identical vectors only), got "
                          f"{threshold!r}; the default is {DEFAULT_THRESHOLD}")
    return float(threshold)


def collection_duplicates(root: str | os.PathLike, threshold: float = DEFAULT_THRESHOLD, *,
                          near: bool = True) -> DuplicateReport:
    """`find_duplicates` of the collection at `root`, opened read-only (no model, no writer lock)."""
    check_threshold(threshold)  # before the collection is opened
    with Collection.open(Path(root)) as col:
        return find_duplicates(col, threshold, near=near)


def find_duplicates(col: Collection, threshold: float = DEFAULT_THRESHOLD, *, near: bool = True) -> DuplicateReport:
    """Group `col`'s live items that duplicate each other (see the module docstring).

    threshold: cosine in (0, 1] at or above which two items are near-duplicates.
    near: False reports exact copies only (no range search).
    Items of one file (pages of one PDF) never form a group by themselves.
    """
    threshold = check_threshold(threshold)
    started = time.perf_counter()
    records = {r.id: r for chunk, _ in col.iter_live(QUERY_CHUNK_ROWS) for r in chunk}
    ids = np.array(sorted(records), dtype=np.int64)
    edges: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for start in range(0, len(ids) if near else 0, QUERY_CHUNK_ROWS):
        chunk_ids = ids[start:start + QUERY_CHUNK_ROWS]
        edges.append(_near_pairs(col, ids, chunk_ids, col.vectors(chunk_ids), threshold))
    edges.append(_exact_pairs(records.values()))
    first, second, scores = (np.concatenate(parts) for parts in zip(*edges))
    live = np.isin(second, ids)  # a tombstoned vector still in the index is no duplicate
    first, second, scores = first[live], second[live], scores[live]
    labels = connected_components(len(ids), np.searchsorted(ids, first), np.searchsorted(ids, second))
    groups = [_group(records, ids[members], first, second, scores) for members in _components(labels)]
    groups = [g for g in groups if g is not None]
    groups.sort(key=lambda g: (-len(g.items), g.keeper.uri))
    seconds = time.perf_counter() - started
    log.info("%s: %d duplicate groups among %d items in %.2f s", col.root, len(groups), len(ids), seconds)
    return DuplicateReport(tuple(groups), len(ids), threshold, seconds)


def _near_pairs(col: Collection, live: np.ndarray, ids: np.ndarray, vectors: np.ndarray,
                threshold: float) -> tuple[np.ndarray, ...]:
    """(first ids, second ids, cosines) of the pairs scoring >= threshold with one chunk of queries
    (`ids` [q] ascending, `vectors` [q, d]; `live`: every live id, ascending), each pair once
    (first < second); the scores are read again from the stored vectors, so they are exact whatever
    codes the index holds."""
    found = col.range_search(vectors, threshold)
    if found is None:  # a flat or binary index: an exact scan of the stored vectors (BLAS) instead
        queries, matches = _flat_pairs(col, live, ids, vectors, threshold)
    else:
        lims, _, matches = found
        queries = np.repeat(ids, np.diff(lims.astype(np.int64)))
    keep = matches > queries
    queries, matches = queries[keep], matches[keep]
    if not len(matches):
        return queries, matches, np.empty(0, dtype=np.float32)
    partners, where = np.unique(matches, return_inverse=True)
    is_live = np.isin(partners, np.fromiter(col.live_ids(partners), dtype=np.int64))
    partner_vectors = np.zeros((len(partners), vectors.shape[1]), dtype=np.float32)
    partner_vectors[is_live] = col.vectors(partners[is_live])
    scores = np.einsum("ij,ij->i", vectors[np.searchsorted(ids, queries)], partner_vectors[where])
    keep = is_live[where] & (scores >= threshold)
    return queries[keep], matches[keep], scores[keep].astype(np.float32)


def _flat_pairs(col: Collection, live: np.ndarray, ids: np.ndarray, vectors: np.ndarray,
                threshold: float) -> tuple[np.ndarray, ...]:
    """(query ids, matching ids) scoring >= threshold over every live stored vector (`live` ids), one
    block of them at a time: a [q, block] product by BLAS, never the whole matrix. Only blocks at or
    after the queries' first id are scanned (each pair is kept once, first < second)."""
    queries, matches = [np.empty(0, dtype=np.int64)], [np.empty(0, dtype=np.int64)]
    for start in range(int(np.searchsorted(live, ids[0])), len(live), SCAN_BLOCK_ROWS):
        block = live[start:start + SCAN_BLOCK_ROWS]
        rows, cols = np.nonzero(vectors @ col.vectors(block).T >= threshold)
        queries.append(ids[rows])
        matches.append(block[cols])
    return np.concatenate(queries), np.concatenate(matches)


def _exact_pairs(records) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pairs of live items with the same content hash and page (each joined to the first of its
    hash), score 1: identical files, whatever their vectors."""
    first_of: dict[tuple[str, int | None], int] = {}
    first, second = [], []
    for record in sorted(records, key=lambda r: r.id):
        if record.content_hash is None:
            continue
        anchor = first_of.setdefault((record.content_hash, record.page), record.id)
        if anchor != record.id:
            first.append(anchor)
            second.append(record.id)
    return np.array(first, dtype=np.int64), np.array(second, dtype=np.int64), np.ones(len(first), dtype=np.float32)


def connected_components(n: int, first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Component label [n] of each node of an undirected graph with edges (first[i], second[i]): the
    smallest node of its component. Vectorised min-label propagation with pointer jumping (no Python
    loop over edges), so a large edge list costs a few numpy passes."""
    labels = np.arange(n, dtype=np.int64)
    if not len(first):
        return labels
    while True:
        before = labels.copy()
        low = np.minimum(labels[first], labels[second])
        np.minimum.at(labels, first, low)
        np.minimum.at(labels, second, low)
        np.minimum.at(labels, before, labels)  # a label's own node takes the lower label too
        labels = labels[labels]  # pointer jumping: follow labels to their roots
        if np.array_equal(labels, before):
            return labels


def _components(labels: np.ndarray) -> Iterator[np.ndarray]:
    """Positions of each component with at least two nodes."""
    order = np.argsort(labels, kind="stable")
    bounds = np.flatnonzero(np.diff(labels[order])) + 1
    for members in np.split(order, bounds):
        if len(members) > 1:
            yield members


def _group(records: dict[int, ItemRecord], member_ids: np.ndarray, first: np.ndarray, second: np.ndarray,
           scores: np.ndarray) -> DuplicateGroup | None:
    """One group from a component's item ids; None when all of them are one file's pages."""
    members = [records[int(i)] for i in member_ids]
    if len({r.uri for r in members}) < 2:
        return None
    items = [_describe(r) for r in members]
    keeper = min(items, key=_keeper_order)
    hashes = {r.content_hash for r in members}
    kind = "exact" if len(hashes) == 1 and None not in hashes else "near"
    scored = [_with_score(item, keeper, first, second, scores) for item in items if item is not keeper]
    scored.sort(key=lambda item: (-item.score, item.uri, item.page or 0))
    return DuplicateGroup(kind, (_replace_score(keeper, 1.0), *scored))


def _keeper_order(item: DuplicateItem) -> tuple:
    """Largest resolution first, then the earliest date, then the shortest path, then the lowest id."""
    return (-item.pixels, item.date if item.date is not None else math.inf, len(item.uri), item.uri, item.id)


def _with_score(item: DuplicateItem, keeper: DuplicateItem, first: np.ndarray, second: np.ndarray,
                scores: np.ndarray) -> DuplicateItem:
    """`item` with its cosine to the keeper when the pair was found (1.0 for an exact copy), else the
    best cosine linking it into the group (it joined through another member)."""
    if item.content_hash is not None and item.content_hash == keeper.content_hash:
        return _replace_score(item, 1.0)
    direct = ((first == item.id) & (second == keeper.id)) | ((first == keeper.id) & (second == item.id))
    linked = direct if direct.any() else (first == item.id) | (second == item.id)
    return _replace_score(item, float(scores[linked].max()) if linked.any() else 0.0)


def _replace_score(item: DuplicateItem, score: float) -> DuplicateItem:
    return DuplicateItem(item.id, item.uri, item.page, item.content_hash, item.width, item.height, item.date,
                         item.date_source, round(score, 6))


def _describe(record: ItemRecord) -> DuplicateItem:
    """A member's pixel size (an image file's header, read lazily: no pixel is decoded) and date (the
    file's mtime as indexed)."""
    width = height = None
    if record.modality in ("image", "image+text") and record.page is None:
        width, height = _image_size(record)
    date_source = "mtime" if record.mtime is not None else None
    return DuplicateItem(int(record.id), record.uri, record.page, record.content_hash, width, height, record.mtime,
                         date_source, 0.0)


def _image_size(record: ItemRecord) -> tuple[int | None, int | None]:
    """The header's size of the file as indexed: read through `open_stored`, so a file replaced by
    a link (to a FIFO, /dev/zero, a private file) since indexing is not opened, just unknown."""
    from PIL import Image, UnidentifiedImageError

    from faste_mm.retrieval.stored_files import open_stored

    try:
        with open_stored(record) as f, Image.open(f) as image:
            return image.size
    except (FasteError, OSError, UnidentifiedImageError, ValueError, Image.DecompressionBombError) as error:
        log.info("%s: pixel size unknown (%s)", record.uri, error)
        return None, None

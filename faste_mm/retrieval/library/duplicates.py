"""Duplicates of a collection: exact copies (the same content hash) and near-duplicates (resized,
re-encoded, slightly cropped copies, burst shots) whose stored vectors score at least a threshold,
found by comparing every pair's sketch and scoring the close pairs exactly (`near_pairs`: 100k
items in seconds, where a range search of the collection's index walked its graph once an item),
joined into connected components, each with a suggested keeper (largest resolution, then a copy
outside a backup/copy/duplicates folder, then the earliest date, then the shortest path) and why it
was kept; byte-identical copies are labelled "exact" inside any group. Receives an open `Collection`; hands back a
`DuplicateReport`. Reads only: it never deletes, moves or changes a file or an item.
"""

from __future__ import annotations

import logging
import math
import os
import re
import time
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from faste_mm.errors import ConfigError, FasteError
from faste_mm.indexers import Collection, ItemRecord
from faste_mm.retrieval.library.near_pairs import candidate_blocks, directions, joined, sketch_cosine, sketches, verified_pairs

log = logging.getLogger(__name__)

# Cosine at or above which two items count as near-duplicates. Copies of one photo resized or
# re-encoded as JPEG score ~0.97-0.99 with Qwen3-VL-Embedding; distinct shots of one scene lower.
DEFAULT_THRESHOLD = 0.95
# Live items read (records and vectors) at a time while sketching: bounded memory whatever the size.
READ_CHUNK_ROWS = 4096
# Words in a folder's name (any folder of the path, case-insensitive, split at anything not a letter
# or digit: "Backups", "Photos (copy)", "duplicates_2023") that mark it as holding spare copies: of
# identical copies, the keeper is one outside such folders. Kept small on purpose ("old" is left out:
# "Old Town" is a place, not a backup).
SPARE_FOLDER_WORDS = frozenset({"backup", "backups", "bak", "copy", "copies", "duplicate", "duplicates"})


@dataclass(frozen=True, slots=True)
class DuplicateItem:
    """One member of a group: the item, its pixel size (None when unknown: not an image, or its
    header is unreadable), its date (seconds since the epoch; `date_source` says from what: "exif",
    "xmp", "iptc", "pdf", "video" for the date taken its file records, "mtime" for the file's
    modification time), its cosine to the group's keeper (1.0 for the keeper and exact copies),
    `match`: "exact" when another member has the same bytes (content hash and page), else "near",
    and `in_spare_folder`: a folder of its path is named like a backup (SPARE_FOLDER_WORDS)."""

    id: int
    uri: str
    page: int | None
    content_hash: str | None
    width: int | None
    height: int | None
    date: float | None
    date_source: str | None
    score: float
    match: str = "near"
    in_spare_folder: bool = False

    @property
    def pixels(self) -> int:
        return (self.width or 0) * (self.height or 0)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class DuplicateGroup:
    """Items that duplicate each other: `kind` "exact" (one content hash) or "near" (vectors scoring
    >= the threshold, directly or through other members; byte-identical members of a near group
    have `match` "exact"); `items[0]` is the suggested keeper (`_keeper_order`), the others follow
    by score; `keeper_reason` says what set the keeper apart from the next best member."""

    kind: str
    items: tuple[DuplicateItem, ...]
    keeper_reason: str = ""

    @property
    def keeper(self) -> DuplicateItem:
        return self.items[0]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "keeper": self.keeper.uri, "keeper_reason": self.keeper_reason,
                "items": [item.to_dict() for item in self.items]}


@dataclass(frozen=True, slots=True)
class DuplicateReport:
    """`Retriever.duplicates`: the groups, largest first; items compared; the threshold; seconds taken."""

    groups: tuple[DuplicateGroup, ...]
    n_items: int
    threshold: float
    elapsed_s: float

    @property
    def n_redundant(self) -> int:
        """Items a user could drop keeping one per group."""
        return sum(len(group.items) - 1 for group in self.groups)

    def to_dict(self) -> dict[str, Any]:
        return {"threshold": self.threshold, "n_items": self.n_items, "n_groups": len(self.groups),
                "n_redundant": self.n_redundant, "elapsed_s": self.elapsed_s,
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
    near: False reports exact copies only (no vector is read).
    Items of one file (pages of one PDF) never form a group by themselves.
    """
    threshold = check_threshold(threshold)
    started = time.perf_counter()
    records: dict[int, ItemRecord] = {}
    stored_ids, codes, max_norm = [], [], 0.0
    planes = directions(col.manifest.dim) if near else None
    for chunk, vectors in col.iter_live(READ_CHUNK_ROWS):  # one pass over the parts: records and sketches
        records.update((r.id, r) for r in chunk)
        if planes is not None and len(chunk):
            stored_ids.append(np.fromiter((r.id for r in chunk), dtype=np.int64, count=len(chunk)))
            codes.append(sketches(vectors, planes))
            max_norm = max(max_norm, float(np.sqrt(np.einsum("ij,ij->i", vectors, vectors).max())))
    ids = np.array(sorted(records), dtype=np.int64)
    edges = [_exact_pairs(records.values())]
    if stored_ids and sketch_cosine(threshold, max_norm) <= 1.0:
        edges.append(_near_pairs(col, np.concatenate(stored_ids), np.concatenate(codes), threshold, max_norm))
    first, second, scores = (np.concatenate(parts) for parts in zip(*edges))
    labels = connected_components(len(ids), np.searchsorted(ids, first), np.searchsorted(ids, second))
    groups = [_group(records, ids[members], first, second, scores) for members in _components(labels)]
    groups = [g for g in groups if g is not None]
    groups.sort(key=lambda g: (-len(g.items), g.keeper.uri))
    seconds = time.perf_counter() - started
    log.info("%s: %d duplicate groups among %d items in %.2f s", col.root, len(groups), len(ids), seconds)
    return DuplicateReport(tuple(groups), len(ids), threshold, seconds)


def _near_pairs(col: Collection, ids: np.ndarray, codes: np.ndarray, threshold: float,
                max_norm: float) -> tuple[np.ndarray, ...]:
    """(first ids, second ids, cosines) of the live items (`ids`, with their sketches `codes`)
    whose stored vectors score >= threshold, each pair once (first < second): candidates by
    sketch, then exact scores of the stored vectors (`near_pairs`), whatever codes the index holds."""
    order = np.argsort(ids, kind="stable")
    ids, codes = ids[order], codes[order]
    n_candidates, found = 0, []
    for first, second in candidate_blocks(codes, sketch_cosine(threshold, max_norm)):  # bounded memory
        n_candidates += len(first)
        found.append(verified_pairs(first, second, lambda rows: col.vectors(ids[rows]), threshold))
    first, second, scores = joined(found)
    log.info("%s: %d pairs close by sketch, %d of them >= %g", col.root, n_candidates, len(scores), threshold)
    return ids[first], ids[second], scores


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
    copies: dict[tuple[str, int | None], int] = {}
    for r in members:
        if r.content_hash is not None:
            copies[(r.content_hash, r.page)] = copies.get((r.content_hash, r.page), 0) + 1
    items = [replace(_describe(r), match="exact" if copies.get((r.content_hash, r.page), 0) > 1 else "near")
             for r in members]
    ranked = sorted(items, key=_keeper_order)
    keeper = ranked[0]
    hashes = {r.content_hash for r in members}
    kind = "exact" if len(hashes) == 1 and None not in hashes else "near"
    scored = [_with_score(item, keeper, first, second, scores) for item in items if item is not keeper]
    scored.sort(key=lambda item: (-item.score, item.uri, item.page or 0))
    return DuplicateGroup(kind, (replace(keeper, score=1.0), *scored), keeper_reason(keeper, ranked[1]))


def _keeper_order(item: DuplicateItem) -> tuple:
    """Largest resolution first, then a copy outside backup/copy/duplicates folders, then the earliest
    date, then the shortest path, then the lowest id."""
    return (-item.pixels, item.in_spare_folder, item.date if item.date is not None else math.inf, len(item.uri),
            item.uri, item.id)


def keeper_reason(keeper: DuplicateItem, runner_up: DuplicateItem) -> str:
    """Why `keeper` comes before `runner_up` (the next in `_keeper_order`): the first criterion that
    differs, in words."""
    if keeper.pixels != runner_up.pixels:
        return f"largest resolution ({keeper.width}x{keeper.height})"
    if keeper.in_spare_folder != runner_up.in_spare_folder:
        return f"not in a backup, copy or duplicates folder (unlike {runner_up.uri})"
    if keeper.date != runner_up.date:
        when = datetime.fromtimestamp(keeper.date, timezone.utc).strftime("%Y-%m-%d %H:%M")
        what = "date taken" if keeper.date_source not in (None, "mtime") else "file date (mtime; no date taken)"
        return f"earliest {what} ({when} UTC)"
    if len(keeper.uri) != len(runner_up.uri):
        return "shortest path"
    return "first path in order"


def is_in_spare_folder(uri: str) -> bool:
    """Whether a folder of `uri` (not the file's own name) is named like a backup (SPARE_FOLDER_WORDS)."""
    folders = Path(uri).parent.parts
    return any(word in SPARE_FOLDER_WORDS for folder in folders for word in re.split(r"[^0-9a-z]+", folder.lower()))


def _with_score(item: DuplicateItem, keeper: DuplicateItem, first: np.ndarray, second: np.ndarray,
                scores: np.ndarray) -> DuplicateItem:
    """`item` with its cosine to the keeper when the pair was found (1.0 for an exact copy), else the
    best cosine linking it into the group (it joined through another member)."""
    if item.content_hash is not None and item.content_hash == keeper.content_hash:
        return replace(item, score=1.0)
    direct = ((first == item.id) & (second == keeper.id)) | ((first == keeper.id) & (second == item.id))
    linked = direct if direct.any() else (first == item.id) | (second == item.id)
    return replace(item, score=round(float(scores[linked].max()) if linked.any() else 0.0, 6))


def _describe(record: ItemRecord) -> DuplicateItem:
    """A member's pixel size (its facts' as scanned; else an image file's header, read lazily: no
    pixel is decoded) and date: the date taken its file records (EXIF, XMP, IPTC, a PDF's or a
    video's creation date, from its facts), else the file's mtime as indexed."""
    facts = record.facts
    width, height = (facts.width, facts.height) if facts is not None else (None, None)
    if (width is None or height is None) and record.modality in ("image", "image+text") and record.page is None:
        width, height = _image_size(record)
    if facts is not None and facts.taken is not None and facts.taken_source not in (None, "mtime"):
        date, date_source = facts.taken, facts.taken_source
    else:
        date, date_source = record.mtime, "mtime" if record.mtime is not None else None
    return DuplicateItem(int(record.id), record.uri, record.page, record.content_hash, width, height, date,
                         date_source, 0.0, in_spare_folder=is_in_spare_folder(record.uri))


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

"""Reading stored vectors back from a collection's parts: by item id (memory-mapped parts kept
open between calls) and every live item in storage order, chunk by chunk. Receives the store,
the directory and the parts' codec; hands back float32 vectors [n, d] decoded from the codes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np

from faste_mm.errors import CollectionError, ConfigError
from faste_mm.indexers import parts
from faste_mm.indexers.quantization import Codec
from faste_mm.indexers.records import ItemRecord, Status
from faste_mm.indexers.store import MetaStore

# Part mappings `MappedParts` keeps open between calls (pruned to the committed parts past this many).
MAPPED_PARTS = 256


class MappedParts:
    """The memory-mapped codes of a collection's parts, mapped once each (part numbers are never
    reused, so a mapping never goes stale; parts a compact removed are dropped from the cache)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._mapped: dict[int, np.ndarray] = {}

    def clear(self) -> None:
        """Forget every mapping (after a compact removed files, or a re-created collection)."""
        self._mapped = {}

    def vectors(self, store: MetaStore, ids: np.ndarray, codec: Codec, dim: int) -> np.ndarray:
        """Stored vectors [n, dim] float32 of item ids; CollectionError names ids without one."""
        wanted = np.asarray(ids, dtype=np.int64).reshape(-1)
        found, part_of, row_of = store.vector_locations(wanted)
        # Array work, not a dict per id: rescoring asks for thousands of candidates a query.
        at = np.minimum(np.searchsorted(found, wanted), max(len(found) - 1, 0))
        known = (found[at] == wanted) if len(found) else np.zeros(len(wanted), dtype=bool)
        if not known.all():
            lost = wanted[~known][:10].tolist()
            raise CollectionError(f"{self.root}: items {lost} have no stored vector "
                                  f"(unknown, failed, or compacted away)")
        part_of, row_of = part_of[at], row_of[at]
        out = np.empty((len(wanted), dim), dtype=np.float32)
        if len(wanted) == 0:
            return out
        order = np.lexsort((row_of, part_of))  # by part, then row: each part read front to back
        sizes = dict(store.parts())
        bounds = np.flatnonzero(np.diff(part_of[order])) + 1
        for group in np.split(order, bounds):
            part = int(part_of[group[0]])
            stored = self._part(store, part, sizes[part], codec.width)
            out[group] = codec.decode(stored[row_of[group]])
        return out

    def _part(self, store: MetaStore, part: int, n_rows: int, width: int) -> np.ndarray:
        mapped = self._mapped.get(part)
        if mapped is None:
            if len(self._mapped) >= MAPPED_PARTS:
                live = {p for p, _ in store.parts()}
                self._mapped = {p: m for p, m in self._mapped.items() if p in live}
            mapped = self._mapped[part] = parts.read_part(self.root, part, n_rows, width)[0]
        return mapped


def iter_live(root: Path, store: MetaStore, codec: Codec,
              chunk_rows: int) -> Iterator[tuple[list[ItemRecord], np.ndarray]]:
    """Every live item with its vector, in storage order, `chunk_rows` at a time: (records,
    vectors [n, dim] float32); memory stays bounded by one chunk (parts are memory-mapped)."""
    if not isinstance(chunk_rows, int) or chunk_rows < 1:
        raise ConfigError(f"iter_live chunk_rows must be an int >= 1, got {chunk_rows!r}")
    for part, n in store.parts():
        vectors, _ = parts.read_part(root, part, n, codec.width)
        live = [(i, row) for i, row, status in store.part_rows(part) if status == Status.OK]
        for start in range(0, len(live), chunk_rows):
            chunk = live[start:start + chunk_rows]
            records = store.records([i for i, _ in chunk])
            rows = [row for _, row in chunk]
            yield [records[i] for i, _ in chunk], codec.decode(vectors[rows])

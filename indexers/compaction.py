"""Compaction of a collection's vector parts: the live rows rewritten into parts of at most
COMPACT_PART_ROWS, tombstones purged, old part files unlinked. Receives the store, the directory
and the parts' codec; hands back what it did (`Collection.compact` then rebuilds the index).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from faste_mm.indexers import parts
from faste_mm.indexers.crash_points import crash_point
from faste_mm.indexers.manifest import MANIFEST_NAME
from faste_mm.indexers.quantization import Codec
from faste_mm.indexers.records import Status
from faste_mm.indexers.store import MetaStore

# compact() rewrites parts to at most this many rows (32 MiB at d=2048 float16).
COMPACT_PART_ROWS = 8192


def compact_parts(root: Path, store: MetaStore, codec: Codec) -> tuple[int, int, int] | None:
    """Drop tombstoned vectors from the parts and merge small parts; None when there is nothing
    to gain, else (vectors dropped, parts before, parts after).

    New parts are written and renamed first, then one transaction repoints the items and
    deletes the tombstones, then old part files are unlinked: a crash at any point leaves
    either the old or the new layout (plus orphans swept on open)."""
    committed = store.parts()
    n_dead = store.n_tombstoned_vectors()
    n_live = sum(n for _, n in committed) - n_dead
    if n_dead == 0 and len(committed) <= max(1, -(-n_live // COMPACT_PART_ROWS)):
        return None
    state = store.state()
    next_part, moves, new_parts = state["next_part"], [], []
    buf_v: list[np.ndarray] = []
    buf_ids: list[np.ndarray] = []

    def flush() -> None:
        nonlocal next_part
        v, i = np.concatenate(buf_v), np.concatenate(buf_ids)
        parts.write_part(root, next_part, v, i, codec.dtype, mode_of=root / MANIFEST_NAME)
        moves.extend((next_part, row, int(item)) for row, item in enumerate(i))
        new_parts.append((next_part, len(i)))
        next_part += 1
        buf_v.clear()
        buf_ids.clear()

    for part, n in committed:
        vectors, ids = parts.read_part(root, part, n, codec.width)
        status = {i: s for i, _, s in store.part_rows(part)}
        keep = np.array([status.get(int(i)) == Status.OK for i in ids], dtype=bool)
        for start in range(0, int(keep.sum()), COMPACT_PART_ROWS):
            sel = np.flatnonzero(keep)[start:start + COMPACT_PART_ROWS]
            buf_v.append(np.asarray(vectors[sel]))
            buf_ids.append(ids[sel])
            if sum(len(b) for b in buf_ids) >= COMPACT_PART_ROWS:
                flush()
    if buf_ids:
        flush()
    crash_point("compact-after-new-parts")
    with store.transaction():
        store.purge_tombstones()
        store.move_rows(moves)
        for part, _ in committed:
            store.delete_part(part)
        for part, n in new_parts:
            store.insert_part(part, n)
        # Every part below the old next_part is now retired (the sweep's `retired_below`).
        store.set_state(next_part=next_part, epoch=state["epoch"] + 1, retired_below=state["next_part"])
    crash_point("compact-after-commit")
    # A reader whose snapshot began before the commit may still read the old files; it
    # retries on the new epoch when they are gone (see `collection_search.in_snapshot`).
    for part, _ in committed:
        parts.remove_part(root, part)
    return n_dead, len(committed), len(new_parts)

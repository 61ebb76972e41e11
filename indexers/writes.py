"""A collection's writes as one transaction: a chunk of vector codes written as one new part,
then its rows, failure rows, replaced uris and settled file stats committed together. Receives
checked records and the codes to store; hands back the new ids (`Collection.commit` is the entry).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from faste_mm.errors import InputError
from faste_mm.indexers import parts
from faste_mm.indexers.crash_points import crash_point
from faste_mm.indexers.manifest import MANIFEST_NAME
from faste_mm.indexers.records import FileStat, ItemRecord, Status, check_unique
from faste_mm.indexers.store import MetaStore


def check_failures(failures: Sequence[ItemRecord], root: Path) -> None:
    """InputError naming a failure record without its error message, or a repeated (uri, page)."""
    for i, r in enumerate(failures):
        if not r.error:
            raise InputError(f"{root}: failure record {r.uri} (row {i}) has no error "
                             f"message; set ItemRecord.error")
    check_unique(failures, root)


def store_chunk(root: Path, store: MetaStore, codes: np.ndarray, dtype: np.dtype, records: Sequence[ItemRecord],
                failures: Sequence[ItemRecord], replace_uris: Sequence[str],
                settle: Sequence[FileStat]) -> tuple[np.ndarray, int, int]:
    """Commit one chunk (see `Collection.commit`): codes [n, width] for `records`, then `failures`.
    Returns (ids [n + n_failed] int64, the part written, the epoch it was written in)."""
    n, n_failed = len(records), len(failures)
    with store.transaction():
        state = store.state()
        ids = np.arange(state["next_id"], state["next_id"] + n + n_failed, dtype=np.int64)
        part = state["next_part"]
        store.tombstone_uris(list(replace_uris))
        try:
            if n:
                # The part is on disk before the rows that reference it commit: a crash in
                # between leaves an orphan file (swept on open), never a row without a vector.
                parts.write_part(root, part, codes, ids[:n], dtype, mode_of=root / MANIFEST_NAME)
                crash_point("add-after-part-written")
                store.insert_items(records, ids[:n], Status.OK, part)
                store.insert_part(part, n)
            # After the rows: adding a uri clears its older failure rows, not these.
            store.insert_items(failures, ids[n:], Status.FAILED, part=None)
            store.set_file_stats(settle)
            store.set_state(next_id=state["next_id"] + n + n_failed, next_part=part + (n > 0))
        except BaseException:
            if n:
                parts.remove_part(root, part)
            raise
    crash_point("add-after-commit")
    return ids, part, state["epoch"]

"""A writer killed at each named crash point (indexers/crash_points.py) leaves both indexes kept in
meta.sqlite beside the rows in step with them: the lexical index (FTS5) and the metadata index
(`items_meta`) that `where` filters read. One subprocess per crash point checks both."""

from __future__ import annotations

import os
import textwrap

import numpy as np
import pytest

from faste_mm.indexers import Collection, ItemRecord, Manifest, SearchFilter
from faste_mm.indexers.crash_points import CRASH_ENV
from tests.helpers.warm_process import run_python

D = 8

WRITER = textwrap.dedent("""
    import sys
    import numpy as np
    from faste_mm.indexers import Collection, ItemRecord, Manifest
    root, step = sys.argv[1], sys.argv[2]
    rng = np.random.default_rng(7)
    with Collection.create(root, Manifest(model_id="m", dim=8), exist_ok=True) as col:
        x = rng.standard_normal((4, 8)).astype(np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        if step.startswith("add"):
            col.add(x, [ItemRecord(uri=f"/d/{step}-{i}.txt", modality="text", text=f"word{i} crash",
                                   metadata={"s": "new", "n": i}) for i in range(4)])
        elif step.startswith("delete"):
            col.delete(uris=["/d/seed-0.txt"])
        else:
            col.delete(uris=["/d/seed-1.txt"])
            col.compact()
""")


def lexical(col: Collection, text: str) -> list[int]:
    return [int(i) for i in col.find(10, texts=[text], mode="lexical").ids[0] if i >= 0]


def filtered(col: Collection, where: dict, indexed: bool) -> list[int]:
    """The ids `where` matches read from the metadata index, or (not `indexed`) by the json_extract
    scan an older file gets."""
    store = col._store
    store._meta_index = indexed
    try:
        return store.filtered_ids(SearchFilter(where=where)).tolist()
    finally:
        store._meta_index = None


@pytest.mark.parametrize("step", ["add-after-part-written", "add-after-commit", "delete-after-commit",
                                  "compact-after-new-parts", "compact-after-commit"])
def test_a_writer_killed_at_a_named_step_leaves_the_lexical_and_metadata_indexes_in_step(tmp_path, step):
    root = tmp_path / "c"
    with Collection.create(root, Manifest(model_id="m", dim=D)) as col:
        x = np.random.default_rng(4).standard_normal((3, D)).astype(np.float32)
        col.add(x / np.linalg.norm(x, axis=1, keepdims=True),
                [ItemRecord(uri=f"/d/seed-{i}.txt", modality="text", text=f"seed{i}", metadata={"s": "old", "n": i})
                 for i in range(3)])
    # a process of its own (tests/helpers/warm_process.py)
    proc = run_python(WRITER, [root, step], env={**os.environ, CRASH_ENV: step}, timeout=120)
    assert proc.returncode == -9, proc.stderr[-2000:]
    with Collection.open(root, writable=True) as col:
        live = sorted(col.live_ids(range(100)))
        # The lexical index: exactly the live items, each found by its name; the killed add all or nothing.
        assert col.read(lambda rows: rows.lexical_ids()) == live
        for record in col.get(live):
            assert record.id in lexical(col, record.uri)
        # only the add that committed holds the word "crash": all four of its items, else none
        assert len(lexical(col, "crash")) == (4 if step == "add-after-commit" else 0)
        # The metadata index: exactly the live items, answering as the scan of the rows does.
        assert sorted({r[0] for r in col._store.db.execute("SELECT id FROM items_meta")}) == live
        for where in ({"s": "old"}, {"s": "new"}, {"n": 0}, {"n": 1}, {"n": 3}):
            assert filtered(col, where, indexed=True) == filtered(col, where, indexed=False)

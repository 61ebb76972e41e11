"""The metadata index (`items_meta`, schema 5) that equality filters read: it returns exactly the
ids the json_extract scan returns, through adds, replacements, failures, deletes, compaction and
the migration from schema 4 (crashes: test_sqlite_indexes_crash.py). Storage only (no model)."""

from __future__ import annotations

import itertools

import numpy as np

from faste_mm.indexers.schema import SCHEMA_VERSION
from faste_mm.indexers import Collection, ItemRecord, Manifest, SearchFilter
from faste_mm.indexers.schema import SCHEMA_VERSION

from tests.helpers.old_schemas import downgrade

D = 8
KEYS = ["s", "n", "f", "b", "nested", "list", "none", "u", "missing", "a.b"]
VALUES = ["a", "ü-ß", "日本", "1", 1, 2, 2.0, 0, 1.5, -3, True, False]


def unit(rng, n):
    x = rng.standard_normal((n, D)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def metadata(i: int) -> dict | None:
    if i % 11 == 10:
        return None
    m = {"s": ["a", "ü-ß", "1", "日本"][i % 4], "n": [1, 2, 0, -3][i % 4], "f": [2.0, 1.5, 1.0][i % 3],
         "b": [True, False][i % 2], "nested": {"s": "a", "n": 1}, "list": ["a", 1], "none": None,
         "u": "ü-ß" if i % 5 else 2, "a.b": i % 3}
    return {k: v for j, (k, v) in enumerate(m.items()) if (i + j) % 7}  # some keys missing


def mixed(tmp_path, name="c") -> Collection:
    col = Collection.create(tmp_path / name, Manifest(model_id="m", dim=D))
    rng = np.random.default_rng(0)
    col.add(unit(rng, 60), [ItemRecord(uri=f"/d/{i}", modality="text", metadata=metadata(i)) for i in range(60)])
    col.add(unit(rng, 20), [ItemRecord(uri=f"/d/{i}", modality="text", metadata=metadata(i + 3))
                            for i in range(0, 40, 2)])  # replacements: the old rows become tombstones
    col.add_failures([ItemRecord(uri=f"/bad/{i}", modality="text", error="boom", metadata=metadata(i))
                      for i in range(5)])
    col.delete(list(range(60, 66)))
    return col


def by_scan(col: Collection, where: SearchFilter) -> list[int]:
    store = col._store
    store._meta_index = False  # the json_extract scan an older file gets
    try:
        return store.filtered_ids(where).tolist()
    finally:
        store._meta_index = None


def by_index(col: Collection, where: SearchFilter) -> list[int]:
    assert col._store.has_meta_index()
    return col._store.filtered_ids(where).tolist()


def assert_index_equals_scan(col: Collection) -> int:
    """Every one-key filter and some two-key ones; returns how many matched anything."""
    hits = 0
    filters = [{k: v} for k, v in itertools.product(KEYS, VALUES)]
    filters += [{"s": "a", "b": True}, {"n": 2, "f": 2}, {"s": "1", "n": 1}]
    for where in map(lambda w: SearchFilter(where=w), filters):
        got = by_index(col, where)
        assert got == by_scan(col, where), where
        hits += bool(got)
    return hits


def test_the_index_returns_what_the_scan_returns_on_a_mixed_collection(tmp_path):
    with mixed(tmp_path) as col:
        assert assert_index_equals_scan(col) > 20
        live = set(col.live_ids(range(200)))
        assert set(by_index(col, SearchFilter(where={"b": True}))) <= live
        assert by_index(col, SearchFilter(where={"n": 2})) == by_index(col, SearchFilter(where={"n": 2.0}))
        assert by_index(col, SearchFilter(where={"b": 1})) == [] != by_index(col, SearchFilter(where={"b": True}))
        assert by_index(col, SearchFilter(where={"n": True})) == [] != by_index(col, SearchFilter(where={"n": 1}))
        assert by_index(col, SearchFilter(where={"nested": "a"})) == []  # nested values are not top-level
        assert col.compact() > 0
        assert assert_index_equals_scan(col) > 20
        db = col._store.db
        assert {r[0] for r in db.execute("SELECT DISTINCT id FROM items_meta")} <= set(col.live_ids(range(200)))


def test_a_unicode_key_is_found_by_its_name(tmp_path):
    """json.dumps escapes non-ASCII keys; json_each decodes them, so the index finds the key (the
    scan's json_extract path on SQLite 3.40 does not; the Python meaning is what counts)."""
    with Collection.create(tmp_path / "c", Manifest(model_id="m", dim=D)) as col:
        col.add(unit(np.random.default_rng(1), 3), [ItemRecord(uri=f"/u{i}", modality="text",
                                                               metadata={"größe": i % 2, "tag": "€"})
                                                    for i in range(3)])
        assert by_index(col, SearchFilter(where={"größe": 1})) == [1]
        assert by_index(col, SearchFilter(where={"tag": "€"})) == [0, 1, 2] == by_scan(col, SearchFilter(where={"tag": "€"}))


def test_filtered_search_and_lexical_filters_use_the_index(tmp_path):
    with mixed(tmp_path) as col:
        where = SearchFilter(where={"s": "a"})
        ids = by_index(col, where)
        queries = unit(np.random.default_rng(2), 3)
        _, found = col.search(queries, k=5, where=where)
        assert set(found[found >= 0].tolist()) <= set(ids) and (found >= 0).sum(axis=1).min() == min(5, len(ids))


def test_migration_from_schema_4_fills_the_index_and_a_schema_4_reader_scans(tmp_path):
    root = tmp_path / "c"
    with mixed(tmp_path) as col:
        want = {w: by_index(col, SearchFilter(where={w: v})) for w, v in [("s", "a"), ("n", 2), ("b", False)]}
    downgrade(root, 4)
    with Collection.open(root) as reader:  # readable as it is: the scan
        assert not reader._store.has_meta_index()
        assert reader._store.filtered_ids(SearchFilter(where={"s": "a"})).tolist() == want["s"]
    with Collection.open(root, writable=True) as col:
        assert col._store.db.execute("SELECT version FROM schema_version").fetchone()[0] == SCHEMA_VERSION
        assert {w: by_index(col, SearchFilter(where={w: v})) for w, v in [("s", "a"), ("n", 2), ("b", False)]} == want
        assert assert_index_equals_scan(col) > 20
        col.add(unit(np.random.default_rng(3), 1), [ItemRecord(uri="/new", modality="text", metadata={"s": "a"})])
        assert by_index(col, SearchFilter(where={"s": "a"})) == want["s"] + [max(col.live_ids(range(500)))]


def test_rebuild_index_refills_a_damaged_filter_index(tmp_path):
    from faste_mm.retrieval.maintenance import rebuild_index

    with mixed(tmp_path) as col:
        col._store.db.execute("DELETE FROM items_meta")  # e.g. a hand-edited file
        col._store.db.commit()
        assert not by_index(col, SearchFilter(where={"s": "a"}))
    rebuild_index(tmp_path / "c")
    with Collection.open(tmp_path / "c") as col:
        assert by_index(col, SearchFilter(where={"s": "a"}))
        assert assert_index_equals_scan(col) > 10

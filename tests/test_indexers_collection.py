"""Collection store: search vs brute force, tombstones, compaction, rebuilds, scans, failures,
batched duplicate lookups, live uris under a folder, and erasing a collection."""

from __future__ import annotations

import hashlib
import os
import sqlite3

import numpy as np
import pytest

from faste_mm.errors import CollectionError, ConfigError, InputError
from faste_mm.indexers import Collection, FileStat, ItemRecord, Manifest, content_hash
from faste_mm.indexers import directory

D = 32


def unit(rng: np.random.Generator, n: int, d: int = D) -> np.ndarray:
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def records(n: int, prefix: str = "item", start: int = 0, **fields) -> list[ItemRecord]:
    return [ItemRecord(uri=f"{prefix}-{start + i}", modality="text", **fields) for i in range(n)]


def make(tmp_path, n: int = 500, seed: int = 0, index_type: str = "auto", name: str = "c"):
    rng = np.random.default_rng(seed)
    col = Collection.create(tmp_path / name, Manifest(model_id="test/model", dim=D,
                                                      index_type=index_type))
    ids = col.add(unit(rng, n), records(n))
    return col, ids, rng


def assert_matches_brute_force(col: Collection, queries: np.ndarray, k: int,
                               scores: np.ndarray, ids: np.ndarray) -> None:
    """Exact top-k over the live stored vectors; ties may be returned in any order."""
    live = _live_ids(col)
    stored = col.vectors(live)
    exact = queries @ stored.T  # [q, n_live]
    kk = min(k, len(live))
    for q in range(len(queries)):
        want = np.sort(exact[q])[::-1][:kk]
        np.testing.assert_allclose(scores[q, :kk], want, atol=1e-5)
        assert np.all(ids[q, kk:] == -1)
        pos = {int(i): j for j, i in enumerate(live)}
        got_true = exact[q, [pos[int(i)] for i in ids[q, :kk]]]  # every id is live
        np.testing.assert_allclose(got_true, scores[q, :kk], atol=1e-5)
        assert len(set(ids[q, :kk].tolist())) == kk


def _live_ids(col: Collection) -> np.ndarray:
    db = sqlite3.connect(col.root / "meta.sqlite")
    try:
        return np.array([r[0] for r in db.execute(
            "SELECT id FROM items WHERE status = 'ok' ORDER BY id")], dtype=np.int64)
    finally:
        db.close()



@pytest.mark.parametrize("seed", [0, 1])
def test_flat_search_matches_brute_force(tmp_path, seed):
    col, _, rng = make(tmp_path, n=400, seed=seed)
    with col:
        queries = unit(rng, 20)
        scores, ids = col.search(queries, k=7)
        assert col.info().index_factory == "Flat"
        assert_matches_brute_force(col, queries, 7, scores, ids)


def test_search_pads_with_minus_one_when_fewer_items_than_k(tmp_path):
    col, _, rng = make(tmp_path, n=3)
    with col:
        queries = unit(rng, 2)
        scores, ids = col.search(queries, k=5)
        assert (ids[:, 3:] == -1).all() and np.isneginf(scores[:, 3:]).all()
        assert_matches_brute_force(col, queries, 5, scores, ids)


def test_tombstoned_items_are_filtered_even_when_they_fill_the_top_k(tmp_path):
    col, ids, rng = make(tmp_path, n=300)
    with col:
        query = unit(rng, 1)
        _, first = col.search(query, k=40)
        assert col.delete(first[0, :30]) == 30  # more than k and more than 2k tombstoned
        assert col.delete(first[0, :30]) == 0  # idempotent
        scores, found = col.search(query, k=5)
        assert not set(found[0].tolist()) & set(first[0, :30].tolist())
        assert_matches_brute_force(col, query, 5, scores, found)


def test_get_returns_records_in_order_and_unknown_id_names_it(tmp_path):
    col, ids, _ = make(tmp_path, n=5)
    with col:
        got = col.get([ids[3], ids[1]])
        assert [r.uri for r in got] == ["item-3", "item-1"]
        assert all(r.status == "ok" and r.added_at is not None for r in got)
        with pytest.raises(CollectionError, match=r"12345") as e:
            col.get([ids[0], 12345])
        assert str(tmp_path / "c") in str(e.value)


def test_rebuild_gives_identical_flat_results_and_stable_ids(tmp_path):
    col, ids, rng = make(tmp_path, n=300)
    with col:
        queries = unit(rng, 10)
        before = col.search(queries, k=10)
        assert col.rebuild_index() == "Flat"
        after = col.search(queries, k=10)
        np.testing.assert_array_equal(before[1], after[1])
        np.testing.assert_array_equal(before[0], after[0])
    with Collection.open(tmp_path / "c") as reader:  # loaded from index.faiss
        np.testing.assert_array_equal(reader.search(queries, k=10)[1], before[1])


def test_ids_are_stable_across_rebuild_to_hnsw(tmp_path):
    col, ids, rng = make(tmp_path, n=600)
    with col:
        queries = col.vectors(ids[:20])
        assert col.rebuild_index("HNSW32") == "HNSW32"
        _, found = col.search(queries, k=1)
        # Each stored vector's nearest neighbour is itself: the id maps back to the same uri.
        np.testing.assert_array_equal(found[:, 0], ids[:20])
        assert [r.uri for r in col.get(found[:, 0])] == [f"item-{i}" for i in range(20)]
    assert Collection.open(tmp_path / "c").manifest.index_factory == "HNSW32"


def test_compact_drops_deleted_vectors_and_keeps_results(tmp_path):
    col, ids, rng = make(tmp_path, n=200)
    with col:
        col.add(unit(rng, 50), records(50, prefix="more"))
        col.delete(ids[::3])
        queries = unit(rng, 8)
        before = col.search(queries, k=6)
        assert col.compact() == len(ids[::3])
        info = col.info()
        assert (info.n_ok, info.n_deleted, info.n_parts) == (250 - len(ids[::3]), 0, 1)
        after = col.search(queries, k=6)
        np.testing.assert_array_equal(before[1], after[1])
        assert_matches_brute_force(col, queries, 6, *after)
        with pytest.raises(CollectionError, match="no stored vector"):
            col.vectors([ids[0]])  # compacted away
        assert col.compact() == 0  # nothing left to do
    files = sorted(p.name for p in (tmp_path / "c" / "vectors").iterdir())
    assert len(files) == 2  # one part: vectors + ids


def test_adding_same_uri_again_replaces_the_live_item(tmp_path):
    col, ids, rng = make(tmp_path, n=4)
    with col:
        new_id = col.add(unit(rng, 1), [ItemRecord(uri="item-2", modality="text")])
        assert col.get(ids[2:3])[0].status == "deleted"
        assert col.get(new_id)[0].status == "ok"
        assert col.info().n_ok == 4


def test_reader_sees_writes_made_after_it_opened(tmp_path):
    col, ids, rng = make(tmp_path, n=100)
    col.close()
    with Collection.open(tmp_path / "c") as reader, \
            Collection.open(tmp_path / "c", writable=True) as writer:
        q = unit(rng, 3)
        reader.search(q, k=3)
        new = unit(rng, 5)
        new_ids = writer.add(new, records(5, prefix="late"))
        writer.delete(ids[:50])
        scores, found = reader.search(new, k=1)
        np.testing.assert_array_equal(found[:, 0], new_ids)
        assert_matches_brute_force(reader, q, 3, *reader.search(q, k=3))


@pytest.mark.parametrize("damage", ["delete", "truncate"])
def test_missing_or_torn_index_file_is_rebuilt_on_search(tmp_path, damage):
    col, _, rng = make(tmp_path, n=150)
    queries = unit(rng, 5)
    expected = col.search(queries, k=4)
    col.close()
    index_file = tmp_path / "c" / "index.faiss"
    if damage == "delete":
        index_file.unlink()
    else:
        index_file.write_bytes(index_file.read_bytes()[:100])
    with Collection.open(tmp_path / "c") as reader:
        np.testing.assert_array_equal(reader.search(queries, k=4)[1], expected[1])


def test_failures_are_recorded_and_replaced_by_a_later_success(tmp_path):
    col, _, rng = make(tmp_path, n=3)
    with col:
        col.add_failures([ItemRecord(uri="/docs/bad.pdf", modality="page",
                                     error="PDF is encrypted")])
        failed = col.info().failures
        assert [(r.uri, r.error, r.status) for r in failed] == [
            ("/docs/bad.pdf", "PDF is encrypted", "failed")]
        assert col.info().n_failed == 1 and col.info().failures[0].uri == "/docs/bad.pdf"
        col.add(unit(rng, 2), [ItemRecord(uri="/docs/bad.pdf", modality="page", page=p)
                               for p in range(2)])
        assert col.info().failures == ()
        assert col.info().n_ok == 5


def test_failure_without_message_is_an_input_error_naming_the_item(tmp_path):
    col, _, _ = make(tmp_path, n=1)
    with col, pytest.raises(InputError, match="x.png"):
        col.add_failures([ItemRecord(uri="x.png", modality="image")])


def test_plan_scan_splits_new_changed_unchanged_vanished(tmp_path):
    rng = np.random.default_rng(0)
    with Collection.create(tmp_path / "c", Manifest(model_id="m", dim=D)) as col:
        stats = {"/p/a.jpg": (10, 1.5), "/p/b.jpg": (20, 2.5), "/p/gone.jpg": (5, 3.0),
                 "/other/x.jpg": (1, 1.0)}
        col.add(unit(rng, 4), [ItemRecord(uri=u, modality="image", size=s, mtime=m)
                               for u, (s, m) in stats.items()])
        col.add_failures([ItemRecord(uri="/p/broken.jpg", modality="image", size=7, mtime=7.0,
                                     error="truncated JPEG")])
        files = [FileStat("/p/a.jpg", 10, 1.5), FileStat("/p/b.jpg", 20, 9.0),
                 FileStat("/p/new.jpg", 3, 1.0), FileStat("/p/broken.jpg", 7, 7.0)]
        plan = col.plan_scan(files, under="/p")
        assert [f.uri for f in plan.new] == ["/p/new.jpg"]
        assert [f.uri for f in plan.changed] == ["/p/b.jpg"]
        assert [f.uri for f in plan.unchanged] == ["/p/a.jpg", "/p/broken.jpg"]
        assert plan.vanished == ("/p/gone.jpg",)  # /other/x.jpg is outside `under`
        retry = col.plan_scan(files, under="/p", retry_failed=True)
        assert [f.uri for f in retry.changed] == ["/p/b.jpg", "/p/broken.jpg"]
        assert col.delete(uris=plan.vanished) == 1
        assert col.plan_scan(files, under="/p").vanished == ()
        assert plan.to_dict()["vanished"] == ["/p/gone.jpg"]


def test_file_stat_of_reads_size_and_mtime(tmp_path):
    f = tmp_path / "a.txt"
    f.write_bytes(b"hello")
    st = FileStat.of(f)
    assert (st.uri, st.size, st.mtime) == (str(f.resolve()), 5, f.stat().st_mtime)


def test_content_hash_finds_identical_content_and_its_vector(tmp_path):
    data = bytes(range(256)) * 5000  # > 1 MiB: exercises chunked reading
    (tmp_path / "a.bin").write_bytes(data)
    (tmp_path / "copy.bin").write_bytes(data)
    h = content_hash(tmp_path / "a.bin")
    assert h == hashlib.sha256(data).hexdigest() == content_hash(tmp_path / "copy.bin")
    rng = np.random.default_rng(0)
    with Collection.create(tmp_path / "c", Manifest(model_id="m", dim=D)) as col:
        v = unit(rng, 1)
        (i,) = col.add(v, [ItemRecord(uri="a.bin", modality="image", content_hash=h)])
        (dup,) = col.read(lambda rows: rows.records_with_hashes([h]))[h]
        assert dup.id == i
        np.testing.assert_allclose(col.vectors([i]), v, atol=1e-3)  # float16 storage
        assert col.read(lambda rows: rows.records_with_hashes(["0" * 64])) == {}


def test_bad_vectors_are_input_errors_naming_the_item(tmp_path):
    col, _, rng = make(tmp_path, n=1)
    with col:
        with pytest.raises(InputError, match=r"\(2, 32\)"):
            col.add(unit(rng, 2, d=16), records(2))
        with pytest.raises(InputError, match="item-1.*norm"):
            col.add(np.vstack([unit(rng, 1), 3 * unit(rng, 1)]), records(2))
        with pytest.raises(InputError, match="item-0.*twice"):
            col.add(unit(rng, 2), [ItemRecord(uri="item-0", modality="text")] * 2)
        with pytest.raises(InputError, match="queries"):
            col.search(unit(rng, 1, d=8), k=1)
        with pytest.raises(ConfigError, match="k"):
            col.search(unit(rng, 1), k=0)
        assert col.info().n_ok == 1  # nothing partial was stored


def test_read_only_collection_refuses_writes_naming_it(tmp_path):
    make(tmp_path, n=2)[0].close()
    with Collection.open(tmp_path / "c") as reader:
        with pytest.raises(CollectionError, match="read-only") as e:
            reader.add(unit(np.random.default_rng(0), 1), records(1))
        assert str(tmp_path / "c") in str(e.value)


def test_info_to_dict_reports_counts_and_size(tmp_path):
    col, ids, _ = make(tmp_path, n=10)
    with col:
        col.delete(ids[:2])
        d = col.info().to_dict()
    assert (d["n_ok"], d["n_deleted"], d["n_failed"], d["dim"]) == (8, 2, 0, D)
    assert d["size_bytes"] > 10 * D * 2 and d["index_type"] == "auto"


def test_find_by_hashes_batches_and_matches_one_lookup_per_hash(tmp_path):
    n = 1203  # more than two chunks of bound parameters
    rng = np.random.default_rng(0)
    hashes = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(n)]
    with Collection.create(tmp_path / "c", Manifest(model_id="m", dim=D)) as col:
        col.add(unit(rng, n), [ItemRecord(uri=f"/p/{i}.png", modality="image", content_hash=h)
                               for i, h in enumerate(hashes)])
        col.add(unit(rng, 2), [ItemRecord(uri="/p/doc.pdf", modality="page", page=p, content_hash=hashes[7])
                               for p in (1, 2)])  # pages of a PDF sharing one file's hash
        col.delete(uris=["/p/3.png"])
        wanted = [*hashes, "0" * 64]
        found = col.read(lambda rows: rows.records_with_hashes(wanted))
        one_by_one = {h: col.read(lambda rows: rows.records_with_hashes([h])).get(h, []) for h in wanted}
        assert found == {h: records for h, records in one_by_one.items() if records}
        assert hashes[3] not in found and [r.uri for r in found[hashes[7]]] == ["/p/7.png", "/p/doc.pdf", "/p/doc.pdf"]


def test_live_uris_lists_a_path_and_what_is_below_it_only(tmp_path):
    rng = np.random.default_rng(0)
    uris = ["/p", "/p/a.png", "/p/sub/b.png", "/p2/c.png", "/p.png", "/q/d.png"]
    with Collection.create(tmp_path / "c", Manifest(model_id="m", dim=D)) as col:
        col.add(unit(rng, len(uris)), [ItemRecord(uri=u, modality="image") for u in uris])
        col.add_failures([ItemRecord(uri="/p/broken.png", modality="image", error="truncated")])
        col.delete(uris=["/q/d.png"])
        live_uris = lambda under=None: col.read(lambda rows: rows.live_uris(under))  # noqa: E731
        assert live_uris("/p/") == ["/p", "/p/a.png", "/p/broken.png", "/p/sub/b.png"]
        assert live_uris("/p/sub/b.png") == ["/p/sub/b.png"] and live_uris("/nope") == []
        assert live_uris() == sorted(set(uris) - {"/q/d.png"} | {"/p/broken.png"})
        for under in ("/p", "/p2", "/"):  # the same uris plan_scan would report vanished
            assert live_uris(under) == list(col.plan_scan([], under=under).vanished)


def test_erase_deletes_only_the_collection_and_refuses_while_another_writer_holds_it(tmp_path):
    col, _, _ = make(tmp_path, n=20)
    col.close()
    root = tmp_path / "c"
    (root / "notes.txt").write_text("mine")  # not the collection's: erase must keep it
    with Collection.open(root, writable=True):
        with pytest.raises(CollectionError, match="another faste-mm process"):
            Collection.erase(root)
    assert Collection.open(root).info().n_ok == 20  # the refused erase touched nothing
    assert Collection.erase(root) is True
    assert sorted(p.name for p in root.iterdir()) == ["notes.txt"]
    assert Collection.erase(root) is False and Collection.erase(tmp_path / "nowhere") is False
    make(tmp_path, n=3, name="d")[0].close()
    assert Collection.erase(tmp_path / "d") and not (tmp_path / "d").exists()
    foreign = tmp_path / "webapp"
    foreign.mkdir()
    (foreign / "manifest.json").write_text('{"name": "my web app"}')
    with pytest.raises(CollectionError, match="invalid manifest"):
        Collection.erase(foreign)
    assert (foreign / "manifest.json").exists()


def test_erase_for_create_refuses_a_folder_with_foreign_files_and_touches_nothing(tmp_path):
    make(tmp_path, n=5)[0].close()
    root = tmp_path / "c"
    (root / "notes.txt").write_text("mine")
    with pytest.raises(CollectionError, match=r"notes.txt.*nothing was erased"):
        Collection.erase(root, for_create=True)
    assert Collection.open(root).info().n_ok == 5
    (root / "notes.txt").unlink()
    (root / "manifest.json.tmp").write_text("torn")  # erase removes temp files, so create accepts them
    assert Collection.erase(root, for_create=True) and not root.exists()


def test_a_lock_file_unlinked_by_erase_never_counts_as_the_writer_lock(tmp_path, monkeypatch):
    make(tmp_path, n=5)[0].close()
    root = tmp_path / "c"
    (root / "notes.txt").write_text("mine")  # keeps the folder through the erase
    stale = os.open(root / directory.LOCK_NAME, os.O_RDWR)  # a writer that opened the lock file ...
    assert Collection.erase(root)  # ... before erase unlinked it, and locks it only afterwards
    (root / "notes.txt").unlink()
    with Collection.create(root, Manifest(model_id="test/model", dim=D)):  # the new writer, on a new file
        handed, open_lock_file = iter([stale]), directory._open_lock_file
        monkeypatch.setattr(directory, "_open_lock_file", lambda path: next(handed, None) or open_lock_file(path))
        with pytest.raises(CollectionError, match="another faste-mm process"):
            Collection.open(root, writable=True)
        monkeypatch.undo()
    with pytest.raises(OSError):
        os.fstat(stale)  # acquire_lock closed the stale descriptor


def test_vectors_gathers_across_parts_like_reading_each_part_by_hand(tmp_path):
    """`vectors` groups ids by part with array work; it must equal a row-by-row gather over the
    part files: ids from several parts, repeated, out of order, and a deleted (not yet compacted) id."""
    from faste_mm.indexers import parts

    col, ids, rng = make(tmp_path, n=40)
    with col:
        more = col.add(unit(rng, 30), records(30, prefix="more"))
        last = col.add(unit(rng, 20), records(20, prefix="last"))
        col.delete([more[3]])
        wanted = [last[5], ids[7], more[3], ids[0], last[19], more[0], ids[7], more[29]]
        got = col.vectors(wanted)
        db = sqlite3.connect(col.root / "meta.sqlite")
        try:
            where = {i: (p, r) for i, p, r in db.execute("SELECT id, part, row FROM items")}
            sizes = dict(db.execute("SELECT part, n_rows FROM parts").fetchall())
        finally:
            db.close()
        assert len({where[i][0] for i in wanted}) == 3  # three parts
        codec = col._codec()
        by_hand = np.stack([codec.decode(parts.read_part(col.root, where[i][0], sizes[where[i][0]],
                                                         codec.width)[0][[where[i][1]]])[0] for i in wanted])
        np.testing.assert_array_equal(got, by_hand)
        assert col.vectors([]).shape == (0, D)
        with pytest.raises(CollectionError, match=r"no stored vector"):
            col.vectors([ids[1], 10_000_000])


def test_search_without_records_returns_what_a_dense_find_returns(tmp_path):
    col, ids, rng = make(tmp_path, n=120)
    with col:
        col.delete(ids[:30])
        queries = unit(rng, 5)
        scores, found = col.search(queries, k=7)
        dense = col.find(7, queries=queries)
        scores_r, found_r, records = dense.scores, dense.ids, dense.records
        np.testing.assert_array_equal(found, found_r)
        np.testing.assert_array_equal(scores, scores_r)
        assert set(records) == {int(i) for i in found_r.ravel() if i >= 0}

"""What a search remembers between calls (the store's counters and filter matches, keyed by SQLite's
data_version and the connection's own row count; the held generation token) is dropped the moment
another connection or process commits, so the next search sees the change; and a selective filter
scored from the index's own copy in RAM equals brute force over the stored vectors of its matches."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import faiss
import numpy as np
import pytest

from faste_mm.indexers import Collection, ItemRecord, Manifest, SearchFilter, match_scan, search
from faste_mm.indexers.quantization import encode_binary, hamming_to_score
from faste_mm.indexers.store import MetaStore

from tests.helpers.bounds import HANG_S

D = 16
D_BITS = D  # a binary index's width in bits


def unit(n: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, D)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def records(start: int, n: int, tag: str = "old") -> list[ItemRecord]:
    return [ItemRecord(uri=f"/d/{i}.txt", modality="text", metadata={"tag": tag}) for i in range(start, start + n)]


# Adds two items tagged "new" and deletes item 0, from another process, then exits.
WRITER = textwrap.dedent("""
    import sys
    import numpy as np
    from faste_mm.indexers import Collection, ItemRecord
    x = np.array({vectors}, dtype=np.float32)
    with Collection.open(sys.argv[1], writable=True) as col:
        col.add(x, [ItemRecord(uri=f"/d/new{{i}}.txt", modality="text", metadata={{"tag": "new"}}) for i in range(2)])
        col.delete([0])
""")


def write_elsewhere(root, vectors: np.ndarray, how: str) -> None:
    """Add `vectors` tagged "new" and delete item 0 through another connection (`how`: "connection",
    a second Collection in this process; "process", a subprocess), committed before this returns."""
    if how == "process":
        code = WRITER.format(vectors=vectors.tolist())
        subprocess.run([sys.executable, "-c", code, str(root)], check=True, timeout=HANG_S)
        return
    with Collection.open(root, writable=True) as col:
        col.add(vectors, records(1000, len(vectors), "new"))
        col.delete([0])


@pytest.mark.parametrize("how", ["connection", "process"])
@pytest.mark.parametrize("index_type", ["Flat", "HNSW32"])
def test_a_commit_by_another_connection_is_seen_by_the_next_search(tmp_path, how, index_type):
    x = unit(300, 0)
    with Collection.create(tmp_path / "c", Manifest(model_id="m", dim=D, index_type=index_type)) as col:
        col.add(x, records(0, 300))
    reader = Collection.open(tmp_path / "c")
    new_tag = SearchFilter(where={"tag": "new"})
    # Warm every remembered check: counters, the index, a filter's (empty) matches.
    assert reader.search(x[:1], k=1)[1][0, 0] == 0
    assert (reader.search(x[:1], k=3, where=new_tag)[1] == -1).all()
    assert reader.search(x[:1], k=1)[1][0, 0] == 0

    fresh = unit(2, 7)
    write_elsewhere(tmp_path / "c", fresh, how)

    _, ids = reader.search(np.concatenate([x[:1], fresh]), k=1)
    assert ids[0, 0] != 0  # the item deleted elsewhere is gone at once
    assert ids[1, 0] == 300 and ids[2, 0] == 301  # the items added elsewhere are found
    _, ids = reader.search(fresh, k=3, where=new_tag)
    assert sorted(ids[0, :2].tolist()) == [300, 301] and ids[0, 2] == -1
    reader.close()


def test_a_writer_sees_its_own_commits_and_forgets_what_it_rolled_back(tmp_path):
    store = MetaStore(tmp_path, writable=True, create=True)
    with store.transaction():
        store.insert_part(0, 5)
    assert store.parts() == [(0, 5)]  # its own commit: data_version does not move, its row count does
    with pytest.raises(RuntimeError):
        with store.transaction():
            store.insert_part(1, 7)
            assert store.parts() == [(0, 5), (1, 7)]  # read inside, remembered
            raise RuntimeError("rolled back")
    assert store.parts() == [(0, 5)]
    store.close()


def filtered_collection(root, index_type: str, vectors: str, n: int = 3000):
    """n items in `bucket` i % 100 (a filter on one keeps 1%: under `search.filter_is_selective`'s
    share), two of bucket 0 deleted (tombstones among the matches): (collection, the live matches)."""
    x = unit(n, 1)
    col = Collection.create(root, Manifest(model_id="m", dim=D, index_type=index_type, vectors=vectors))
    col.add(x, [ItemRecord(uri=f"/d/{i}", modality="text", metadata={"bucket": i % 100}) for i in range(n)])
    col.delete([100, 500])
    assert col.rebuild_index() == index_type
    return col, np.array([i for i in range(0, n, 100) if i not in (100, 500)])


BUCKET_0 = SearchFilter(where={"bucket": 0})


@pytest.mark.parametrize("index_type, vectors, in_ram", [
    ("Flat", "float32", True), ("HNSW32", "float32", True), ("IVF16,Flat", "float32", False),
    ("SQ8", "int8", False), ("BFlat", "binary", False)])
def test_a_selective_filter_is_brute_force_over_its_matches(tmp_path, monkeypatch, index_type, vectors, in_ram):
    """Exact where the index scores as the parts do (Flat and HNSW from RAM, IVF Flat with every list
    scanned under a selector), and for quantized codes whenever the rescored candidates cover every
    match (rescore 10 x k = 100 > 28 matches): every match was scored, none missed."""
    col, allowed = filtered_collection(tmp_path / "c", index_type, vectors)
    queries = unit(6, 2)
    truth = queries @ col.vectors(allowed).T  # what the parts hold, decoded
    order = np.argsort(-truth, axis=1, kind="stable")[:, :10]

    assert (col._index.exact_fetch(allowed) is not None) == in_ram
    scores, ids = col.search(queries, k=10, where=BUCKET_0, rescore=None if vectors == "float32" else 10)
    np.testing.assert_array_equal(ids, allowed[order])
    np.testing.assert_allclose(scores, np.take_along_axis(truth, order, axis=1), rtol=0, atol=1e-5)

    # Read from the parts instead (the path of an index that can do neither): the same hits.
    monkeypatch.setattr(type(col._index), "exact_fetch", lambda self, ids: None)
    monkeypatch.setattr(type(col._index), "search_matches", lambda self, *a: None)
    disk_scores, disk_ids = col.search(queries, k=10, where=BUCKET_0)
    np.testing.assert_array_equal(disk_ids, ids)
    np.testing.assert_allclose(disk_scores, scores, rtol=0, atol=1e-5)
    col.close()


@pytest.mark.parametrize("index_type, vectors", [
    ("SQ8", "int8"), ("BFlat", "binary"), ("HNSW32_SQ8", "int8"), ("IVF16,SQ8", "float32"), ("IVF16,Flat", "float32"),
    ("IVF16_HNSW32,SQ8", "float32")])
def test_the_matches_are_scored_by_the_index_codes_under_a_selector(tmp_path, index_type, vectors):
    """`search_matches` returns the best of the matches by the index's own scores, exactly those an
    exhaustive search without a selector gives them (every IVF list probed; an HNSW graph's storage
    scanned); a quantized index's filtered hits are its candidates among the matches, rescored."""
    col, allowed = filtered_collection(tmp_path / "c", index_type, vectors)
    queries = unit(6, 2)
    col.search(queries[:1], k=1)  # loads the index
    derived = col._index
    scores, ids = derived.search_matches(queries, allowed, 12)
    assert np.isin(ids, allowed).all() and (ids >= 0).all()

    # The reference: FAISS's scores of every row, no selector, kept to the matches' rows in numpy.
    matcher = match_scan.match_scan(derived.index)
    everything = faiss.SearchParametersIVF(nprobe=matcher.core.nlist) if matcher.centroids is not None else None
    q = encode_binary(queries) if vectors == "binary" else queries
    D, rows = matcher.core.search(q, matcher.core.ntotal, params=everything)
    row_ids = faiss.vector_to_array(derived.index.id_map)[rows]
    if vectors == "binary":
        D = hamming_to_score(D, D_BITS)
    for r in range(len(queries)):
        best = np.sort(D[r][np.isin(row_ids[r], allowed)])[::-1][:12]
        np.testing.assert_allclose(scores[r], best, rtol=0, atol=1e-5)  # scores: ties may order ids either way

    # The collection's filtered search: those candidates (k x its default rescore) rescored exactly.
    truth = queries @ col.vectors(allowed).T
    hit_scores, hit_ids = col.search(queries, k=5, where=BUCKET_0)
    assert np.isin(hit_ids, allowed).all() and (hit_ids >= 0).all()
    exact = np.take_along_axis(truth, np.searchsorted(allowed, hit_ids), axis=1)
    np.testing.assert_allclose(hit_scores, exact, rtol=0, atol=1e-5)
    col.close()


def test_the_version_a_snapshot_reports_is_the_one_its_reads_see(tmp_path):
    """Reading data_version inside BEGIN starts the snapshot: a commit after it is invisible to the
    snapshot's reads, so counters remembered under that version are the snapshot's own."""
    with Collection.create(tmp_path / "c", Manifest(model_id="m", dim=D)) as col:
        col.add(unit(3, 0), records(0, 3))
    reader = MetaStore(tmp_path / "c", writable=False)
    writer = Collection.open(tmp_path / "c", writable=True)
    with reader.read_snapshot():
        version = reader.version()
        writer.add(unit(2, 1), records(10, 2))  # commits a part and its rows
        assert reader.version() == version
        assert reader.parts() == [(0, 3)] and reader.counts()["ok"] == 3
    assert reader.version() != version
    assert reader.parts() == [(0, 3), (1, 2)] and reader.counts()["ok"] == 5
    writer.close()
    reader.close()


def test_an_unchanged_collection_is_searched_without_a_transaction(tmp_path, monkeypatch):
    """An unfiltered search that needs no SQL (no tombstone in the index, no rescoring) skips the
    snapshot while the file's version is the last snapshot's; any change, a writer's own included,
    sends the next search through a snapshot again, which sees it."""
    x = unit(200, 0)
    col = Collection.create(tmp_path / "c", Manifest(model_id="m", dim=D, index_type="HNSW32"))
    col.add(x[:100], records(0, 100))
    snapshots = []
    real = type(col._store).read_snapshot
    monkeypatch.setattr(type(col._store), "read_snapshot", lambda self: (snapshots.append(1), real(self))[1])

    def searched_in_snapshot(queries, **kw) -> tuple[np.ndarray, bool]:
        before = len(snapshots)
        ids = col.search(queries, k=1, **kw)[1]
        return ids[:, 0], len(snapshots) > before

    assert searched_in_snapshot(x[:1]) == (0, True)  # the first: a snapshot, remembered
    assert searched_in_snapshot(x[1:2]) == (1, False)
    col.add(x[100:], records(100, 100))  # the writer's own commit moves its row count
    assert searched_in_snapshot(x[150:151]) == (150, True)
    assert searched_in_snapshot(x[150:151]) == (150, False)
    col.delete([150])  # a tombstone in the index: every search reads the live ids
    assert searched_in_snapshot(x[150:151])[0] != 150
    found, in_snapshot = searched_in_snapshot(x[150:151])
    assert found != 150 and in_snapshot
    assert searched_in_snapshot(x[2:3], where=SearchFilter(where={"tag": "old"}))[1]  # a filter reads its ids
    col.close()

    sq8 = Collection.create(tmp_path / "q", Manifest(model_id="m", dim=D, index_type="SQ8", vectors="int8"))
    sq8.add(x, records(0, 200))
    col = sq8
    monkeypatch.setattr(type(col._store), "read_snapshot", lambda self: (snapshots.append(1), real(self))[1])
    assert searched_in_snapshot(x[:1])[1] and searched_in_snapshot(x[:1])[1]  # rescoring reads the parts' rows
    assert searched_in_snapshot(x[:1], rescore=0)[1] is False  # the index's own scores: none
    sq8.close()


@pytest.mark.parametrize("index_type, vectors, every_below, rescore, depth", [
    ("BFlat", "binary", 2000, 1, 28), ("BFlat", "binary", 10, 1, 10), ("BFlat", "binary", 0, 1, 9),
    ("BFlat", "binary", 0, 2, 10), ("BFlat", "binary", 2000, 0, 5), ("SQ8", "int8", 2000, 1, 5)])
def test_a_selective_filter_rescores_a_share_of_its_matches(tmp_path, monkeypatch, index_type, vectors, every_below,
                                                             rescore, depth):
    """Sign bits rank a filter's matches worse than an unfiltered search's neighbours: of the 28
    matches, every one below `every_below`, else at least the share (0.3: 9) or k x rescore when more;
    none with rescore 0 (the index's own top k); int8 codes rank well enough without a share."""
    monkeypatch.setitem(search.FILTER_RESCORE_SHARE, "binary", (0.3, every_below))
    col, allowed = filtered_collection(tmp_path / "c", index_type, vectors)
    asked = []
    real = type(col._index).search_matches
    monkeypatch.setattr(type(col._index), "search_matches",
                        lambda self, q, a, k: (asked.append(k), real(self, q, a, k))[1])
    col.search(unit(2, 3), k=5, where=BUCKET_0, rescore=rescore)
    assert asked == [depth]
    col.close()


def test_the_row_locations_of_a_rescored_filter_are_remembered_until_the_file_changes(tmp_path):
    """A selective filter's matches are all rescored at every search with it: from its second search on,
    their part/row locations are not read again while the file is unchanged, however many unfiltered
    searches (one-off candidate sets, never kept) come between; after a commit they are read again
    (a new match is then found and rescored from its own row)."""
    col, allowed = filtered_collection(tmp_path / "c", "BFlat", "binary")
    reads = []
    col._store.db.set_trace_callback(lambda sql: reads.append(sql) if "SELECT id, part, row" in sql else None)
    queries = unit(3, 4)
    first = col.search(queries, k=5, where=BUCKET_0)
    again = col.search(queries, k=5, where=BUCKET_0)
    assert len(reads) == 2  # asked once: read and not kept; twice: read and kept
    for seed in range(20):  # unfiltered searches rescore other candidates each time
        col.search(unit(1, 100 + seed), k=5)
    assert len(reads) == 22
    third = col.search(queries, k=5, where=BUCKET_0)
    assert len(reads) == 22
    for a, b in [(first, again), (first, third)]:
        assert np.array_equal(a[1], b[1]) and np.array_equal(a[0], b[0])
    new = queries[:1] / np.linalg.norm(queries[:1])  # the first query itself, in bucket 0: its best hit
    col.add(new, [ItemRecord(uri="/d/new", modality="text", metadata={"bucket": 0})])
    after = col.search(queries[:1], k=5, where=BUCKET_0)
    assert len(reads) == 23 and after[1][0, 0] == 3000
    col.close()

"""What a search remembers between calls (the store's counters and filter matches, keyed by SQLite's
data_version and the connection's own row count; the held generation token) is dropped the moment
another connection or process commits, so the next search sees the change; and a selective filter
scored from the index's own copy in RAM equals brute force over the stored vectors of its matches."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from faste_mm.indexers import Collection, ItemRecord, Manifest, SearchFilter
from faste_mm.indexers.store import MetaStore

D = 16


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
        subprocess.run([sys.executable, "-c", code, str(root)], check=True)
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


@pytest.mark.parametrize("index_type, vectors, in_ram", [
    ("Flat", "float32", True), ("HNSW32", "float32", True), ("SQ8", "int8", False), ("BFlat", "binary", False)])
def test_a_selective_filter_is_brute_force_over_its_matches(tmp_path, monkeypatch, index_type, vectors, in_ram):
    n = 3000  # the filter keeps 1%: under `search.filter_is_selective`'s share
    x = unit(n, 1)
    col = Collection.create(tmp_path / "c", Manifest(model_id="m", dim=D, index_type=index_type, vectors=vectors))
    col.add(x, [ItemRecord(uri=f"/d/{i}", modality="text", metadata={"bucket": i % 100}) for i in range(n)])
    col.delete([100, 500])  # tombstones among the matches
    assert col.rebuild_index() == index_type
    where = SearchFilter(where={"bucket": 0})
    queries = unit(6, 2)
    allowed = np.array([i for i in range(0, n, 100) if i not in (100, 500)])
    stored = col.vectors(allowed)  # what the parts hold, decoded
    truth = queries @ stored.T
    order = np.argsort(-truth, axis=1, kind="stable")[:, :10]

    assert (col._index.exact_fetch(allowed) is not None) == in_ram
    scores, ids = col.search(queries, k=10, where=where)
    np.testing.assert_array_equal(ids, allowed[order])
    np.testing.assert_allclose(scores, np.take_along_axis(truth, order, axis=1), rtol=0, atol=1e-6)

    monkeypatch.setattr(type(col._index), "exact_fetch", lambda self, ids: None)  # read from the parts instead
    disk_scores, disk_ids = col.search(queries, k=10, where=where)
    np.testing.assert_array_equal(disk_ids, ids)
    np.testing.assert_allclose(disk_scores, scores, rtol=0, atol=1e-6)
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

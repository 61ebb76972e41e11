"""Scan planning (indexers/scan_plan.py) and the collection's dense read path
(indexers/collection_search.py) as functions, checked against a by-hand reference and against
brute-force numpy. No model: vectors are seeded random unit vectors."""

from __future__ import annotations

import numpy as np
import pytest

from faste_mm.indexers import Collection, FileStat, ItemRecord, Manifest
from faste_mm.indexers.collection_search import dense_hits, lexical_hits
from faste_mm.indexers.records import Status
from faste_mm.indexers.scan_plan import plan_scan


def _stat(uri: str, size: int = 1, mtime: float = 1.0) -> FileStat:
    return FileStat(uri=uri, size=size, mtime=mtime)


KNOWN = {"/a/x.png": (1, 1.0, Status.OK), "/a/y.png": (1, 1.0, Status.OK), "/a/sub/z.png": (1, 1.0, Status.FAILED),
         "/ab/w.png": (1, 1.0, Status.OK), "/b/v.png": (1, 1.0, Status.OK)}


def test_plan_scan_splits_files_into_new_changed_unchanged_and_vanished_under_the_prefix():
    files = [_stat("/a/x.png"), _stat("/a/y.png", size=2), _stat("/a/sub/z.png"), _stat("/a/new.png")]
    plan = plan_scan(KNOWN, files, under="/a/")
    assert [f.uri for f in plan.new] == ["/a/new.png"]
    assert [f.uri for f in plan.changed] == ["/a/y.png"]
    assert [f.uri for f in plan.unchanged] == ["/a/x.png", "/a/sub/z.png"]
    assert plan.vanished == ()  # "/ab/w.png" shares the prefix's letters, not its folder


@pytest.mark.parametrize("under, vanished", [(None, ("/a/sub/z.png", "/ab/w.png", "/b/v.png")),
                                             ("/a", ("/a/sub/z.png",)), ("/a/sub/z.png", ("/a/sub/z.png",)),
                                             ("/c", ())])
def test_plan_scan_reports_only_uris_at_or_below_under_as_vanished(under, vanished):
    files = [_stat("/a/x.png"), _stat("/a/y.png")]
    assert plan_scan(KNOWN, files, under=under).vanished == vanished


def test_plan_scan_retries_failed_files_only_when_asked():
    files = [_stat("/a/sub/z.png")]
    assert [f.uri for f in plan_scan(KNOWN, files, retry_failed=False).unchanged] == ["/a/sub/z.png"]
    assert [f.uri for f in plan_scan(KNOWN, files, retry_failed=True).changed] == ["/a/sub/z.png"]


@pytest.fixture()
def stored(tmp_path):
    """A model-free collection of 300 random unit vectors, every third one deleted."""
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((300, 16)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    records = [ItemRecord(uri=f"/p/{i}.txt", modality="text", text=f"word{i % 7} item{i}") for i in range(300)]
    col = Collection.create(tmp_path / "col", Manifest(model_id="m", dim=16))
    ids = col.add(vectors, records)
    col.delete(ids[::3])
    yield col, vectors, ids
    col.close()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_dense_hits_equal_brute_force_over_the_live_vectors(stored, seed):
    col, _, ids = stored
    queries = np.random.default_rng(seed).standard_normal((5, 16)).astype(np.float32)
    col.save_index()  # brings the derived index up to date (dense_hits reads it as it is)
    scores, found = dense_hits(col._index, col._store, queries, 10, None, None, None, None,
                               col.manifest.stored_precision, col.vectors)
    live = np.setdiff1d(np.arange(300), np.arange(0, 300, 3))
    expected = queries @ col.vectors(ids[live]).T  # the stored copy (float16 by default), as the index holds it
    for row in range(len(queries)):
        best = live[np.argsort(-expected[row], kind="stable")[:10]]
        assert set(ids[best].tolist()) == set(found[row].tolist())  # no tombstoned id, none missing
        np.testing.assert_allclose(scores[row], np.sort(expected[row])[::-1][:10], rtol=1e-5, atol=1e-5)


def test_lexical_hits_find_live_items_by_their_words_and_pad_the_rest(stored):
    col, _, ids = stored
    scores, found = lexical_hits(col._store, col.root, ["item4", "nothing-here"], 3, None, syntax=False)
    assert found[0].tolist() == [int(ids[4]), -1, -1] and np.isneginf(scores[0, 1:]).all()
    assert (found[1] == -1).all()
    deleted = lexical_hits(col._store, col.root, ["item3"], 3, None, syntax=False)[1]
    assert (deleted == -1).all()  # item 3 was deleted: it left the lexical index too

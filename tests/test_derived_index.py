"""DerivedIndex: index.faiss as a cache of the vector parts. Built from the parts when there is no
file, adopted when the manifest says it covers this epoch, caught up part by part, rebuilt when
stale or from another epoch; every answer equals brute force over the parts."""

from __future__ import annotations

import numpy as np
import pytest

from faste_mm.indexers import parts
from faste_mm.indexers.derived_index import DerivedIndex, desired_factory, max_part
from faste_mm.indexers.manifest import Manifest

DIM = 16


def _unit(rng: np.random.Generator, n: int) -> np.ndarray:
    v = rng.standard_normal((n, DIM)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


@pytest.fixture()
def stored(tmp_path):
    """Three parts of 5, 7 and 4 vectors with ids 0..15, written as a collection writes them."""
    (tmp_path / parts.VECTORS_DIR).mkdir()
    rng = np.random.default_rng(0)
    vectors, committed, next_id = [], [], 0
    for part, n in enumerate((5, 7, 4)):
        v = _unit(rng, n)
        parts.write_part(tmp_path, part, v, np.arange(next_id, next_id + n), "float32")
        vectors.append(v)
        committed.append((part, n))
        next_id += n
    return tmp_path, np.concatenate(vectors), committed


def _brute_force(vectors: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    return np.argsort(-(queries @ vectors.T), axis=1, kind="stable")[:, :k]


def _saved(index: DerivedIndex, manifest: Manifest) -> Manifest:
    """The manifest a collection writes after `index.save()`."""
    epoch, covered = index.key
    return manifest.replace(index_factory=index.factory, index_epoch=epoch, index_max_part=covered)


def test_builds_from_the_parts_and_searches_like_brute_force(stored):
    root, vectors, committed = stored
    manifest = Manifest(model_id="m", dim=DIM, vector_dtype="float32")
    index = DerivedIndex(root, DIM)
    built = index.current(0, committed, manifest, manifest)
    assert built.ntotal == 16 and index.key == (0, 2) and index.factory == desired_factory(manifest, committed) == "Flat"
    queries = _unit(np.random.default_rng(1), 3)
    scores, ids = index.search(queries, 4, None, None)
    np.testing.assert_array_equal(ids, _brute_force(vectors, queries, 4))
    np.testing.assert_allclose(scores, np.sort(queries @ vectors.T, axis=1)[:, ::-1][:, :4], rtol=1e-5)


def test_append_keeps_a_current_index_current_and_skips_a_stale_one(stored):
    root, vectors, committed = stored
    manifest = Manifest(model_id="m", dim=DIM, vector_dtype="float32")
    index = DerivedIndex(root, DIM)
    index.current(0, committed[:2], manifest, manifest)  # parts 0 and 1 only
    index.append(0, 2, older_max_part=1, load=lambda: vectors[12:], ids=np.arange(12, 16))
    assert index.key == (0, 2) and index.index.ntotal == 16
    loads = []
    index.append(0, 3, older_max_part=5, load=lambda: loads.append(1), ids=np.arange(16, 17))  # not current: no read
    assert loads == [] and index.key == (0, 2)


def test_a_saved_index_of_this_epoch_is_adopted_and_caught_up(stored):
    root, vectors, committed = stored
    manifest = Manifest(model_id="m", dim=DIM, vector_dtype="float32")
    first = DerivedIndex(root, DIM)
    first.current(0, committed[:2], manifest, manifest)
    first.save()
    saved = _saved(first, manifest)
    again = DerivedIndex(root, DIM)
    index = again.current(0, committed, saved, manifest)  # part 2 was written after the save
    assert index.ntotal == 16 and again.key == (0, 2)
    queries = _unit(np.random.default_rng(2), 2)
    np.testing.assert_array_equal(again.search(queries, 5, None, None)[1], _brute_force(vectors, queries, 5))


@pytest.mark.parametrize("change", ["other epoch", "wrong size"])
def test_a_saved_index_that_does_not_match_is_rebuilt_from_the_parts(stored, change):
    root, vectors, committed = stored
    manifest = Manifest(model_id="m", dim=DIM, vector_dtype="float32")
    first = DerivedIndex(root, DIM)
    first.current(0, committed[:1], manifest, manifest)  # covers part 0: 5 vectors
    first.save()
    saved = _saved(first, manifest)
    if change == "wrong size":
        saved = saved.replace(index_max_part=1)  # claims 12 vectors, the file holds 5
    epoch = 1 if change == "other epoch" else 0
    again = DerivedIndex(root, DIM)
    assert again.current(epoch, committed, saved, manifest).ntotal == 16
    assert again.key == (epoch, max_part(committed))
    queries = _unit(np.random.default_rng(3), 2)
    np.testing.assert_array_equal(again.search(queries, 3, None, None)[1], _brute_force(vectors, queries, 3))

"""Quantized vectors (8-bit codes, sign bits) and two-stage search, against brute-force numpy over
the dequantized vectors; storage only (vectors seeded with numpy, no model)."""

from __future__ import annotations

import numpy as np
import pytest

from faste_mm.errors import CollectionError, ConfigError
from faste_mm.indexers import Collection, ItemRecord, Manifest, SearchFilter, parts, quantization, search
from faste_mm.retrieval.profile import CollectionProfile


def clustered(rng: np.random.Generator, n: int, d: int, centers: int = 8) -> np.ndarray:
    c = rng.standard_normal((centers, d)).astype(np.float32)
    x = c[rng.integers(0, centers, n)] + 0.6 * rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def records(start: int, n: int) -> list[ItemRecord]:
    return [ItemRecord(uri=f"u{i}", modality="text") for i in range(start, start + n)]


def create(tmp_path, x, **settings) -> Collection:
    col = Collection.create(tmp_path / "c", Manifest(model_id="m", dim=x.shape[1], **settings))
    col.add(x, records(0, len(x)))
    return col


def same_sets_tolerating_ties(found: np.ndarray, scores: np.ndarray, reference: np.ndarray, k: int) -> None:
    """Each row of `found` is a top-k of `reference` scores [q, n]: every hit scores at least the
    k-th best reference score (a tie at the boundary may pick either item)."""
    kth = -np.sort(-reference, axis=1)[:, k - 1]
    got = np.take_along_axis(reference, found, axis=1)
    assert np.all(got >= kth[:, None] - 1e-5)
    assert np.allclose(scores, -np.sort(-got, axis=1), atol=1e-4)


def test_hamming_equals_numpy_popcount_of_unpacked_bits():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((5, 64)), rng.standard_normal((7, 64))
    ba, bb = quantization.encode_binary(a), quantization.encode_binary(b)
    reference = ((a[:, None, :] > 0) != (b[None, :, :] > 0)).sum(axis=2)
    assert np.array_equal(quantization.hamming(ba, bb), reference)
    unpacked = np.unpackbits(ba[:, None, :] ^ bb[None, :, :], axis=2).sum(axis=2)
    assert np.array_equal(quantization.hamming(ba, bb), unpacked)


def test_int8_codes_round_trip_and_clip_outside_the_calibrated_ranges():
    rng = np.random.default_rng(1)
    x = clustered(rng, 300, 32)
    ranges = quantization.calibrate_int8(x)
    decoded = quantization.decode_int8(quantization.encode_int8(x, ranges), ranges)
    step = (ranges.hi - ranges.lo) / 255
    assert np.all(np.abs(decoded - x) <= step / 2 + 1e-6)  # half a step: the code's centre
    far = np.full((1, 32), 10.0, dtype=np.float32)
    assert np.all(quantization.encode_int8(far, ranges) == 255)


@pytest.mark.parametrize("index_type", ["auto", "HNSW32_SQ8"])
def test_int8_search_equals_brute_force_over_the_dequantized_vectors(tmp_path, index_type):
    rng = np.random.default_rng(2)
    x, queries = clustered(rng, 600, 32), clustered(rng, 12, 32)
    with create(tmp_path, x, vectors="int8", keep="int8", index_type=index_type) as col:
        ranges = col.manifest.int8_ranges
        scores, found = col.search(queries, k=10, rescore=0, ef_search=600)
    dequantized = quantization.decode_int8(quantization.encode_int8(x, ranges), ranges)
    same_sets_tolerating_ties(found, scores, queries @ dequantized.T, 10)


def test_binary_search_equals_brute_force_hamming_with_keep_none(tmp_path):
    rng = np.random.default_rng(3)
    x, queries = clustered(rng, 500, 64), clustered(rng, 10, 64)
    with create(tmp_path, x, vectors="binary", keep="none") as col:
        scores, found = col.search(queries, k=10)  # nothing finer on disk: the index's scores
        info = col.info()
    stored = np.load(parts.vectors_path(tmp_path / "c", 0))
    assert stored.shape == (500, 8) and stored.dtype == np.uint8  # 64 dims -> 8 bytes a vector
    assert (info.vectors, info.keep) == ("binary", "none")
    reference = quantization.hamming_to_score(
        quantization.hamming(quantization.encode_binary(queries), quantization.encode_binary(x)), 64)
    same_sets_tolerating_ties(found, scores, reference, 10)


@pytest.mark.parametrize("vectors,keep", [("binary", "float"), ("binary", "int8"), ("int8", "float")])
def test_rescoring_restores_the_finer_order_among_the_candidates(tmp_path, vectors, keep):
    rng = np.random.default_rng(4)
    x, queries = clustered(rng, 800, 64), clustered(rng, 9, 64)
    k, oversample = 5, 4
    with create(tmp_path, x, vectors=vectors, keep=keep) as col:
        coarse_s, candidates = col.search(queries, k=k * oversample, rescore=0)
        scores, found = col.search(queries, k=k, rescore=oversample)
        stored = col.vectors(range(len(x)))  # what the parts keep, decoded
    for row in range(len(queries)):
        exact = queries[row] @ stored[candidates[row]].T
        best = candidates[row][np.argsort(-exact, kind="stable")[:k]]
        assert set(found[row]) <= set(candidates[row])
        assert np.allclose(scores[row], np.sort(exact)[::-1][:k], atol=1e-5)
        assert np.allclose(queries[row] @ stored[found[row]].T, scores[row], atol=1e-5)
        assert len(set(found[row]) ^ set(best)) == 0 or np.isclose(scores[row][-1], np.sort(exact)[::-1][k])


def test_int8_ranges_are_fixed_by_the_first_add_and_survive_compaction(tmp_path):
    rng = np.random.default_rng(5)
    first, later = clustered(rng, 50, 32), 0.1 * clustered(rng, 50, 32)
    later[:, 0] = 0.99  # far outside the first batch's range in dimension 0
    later /= np.linalg.norm(later, axis=1, keepdims=True)
    with create(tmp_path, first, vectors="int8", keep="int8") as col:
        ranges = col.manifest.int8_ranges
        codes = np.load(parts.vectors_path(tmp_path / "c", 0)).copy()
        col.add(later, records(50, 50))
        assert col.manifest.int8_ranges == ranges
        col.delete(range(10))
        col.compact()
    with Collection.open(tmp_path / "c") as col:
        assert col.manifest.int8_ranges == ranges
        assert np.array_equal(col.vectors(range(10, 50)), quantization.decode_int8(codes[10:], ranges))
    assert ranges.hi[0] < later[:, 0].min()  # the later vectors were clipped, not used to re-calibrate


def test_conflicting_vector_precision_is_refused(tmp_path):
    rng = np.random.default_rng(6)
    create(tmp_path, clustered(rng, 20, 32), vectors="int8", keep="int8").close()
    with pytest.raises(CollectionError, match="vectors: collection has 'int8', request has 'binary'"):
        Collection.create(tmp_path / "c", Manifest(model_id="m", dim=32, vectors="binary", keep="int8"),
                          exist_ok=True)
    with pytest.raises(ConfigError, match="keep='int8'"):
        Manifest(model_id="m", dim=32, vectors="float16", keep="int8")
    with pytest.raises(ConfigError, match="does not hold binary vectors"):
        Collection.create(tmp_path / "d", Manifest(model_id="m", dim=32, vectors="binary", index_type="HNSW32"))


def test_matryoshka_dims_and_binary_store_64_bytes_a_vector(tmp_path):
    rng = np.random.default_rng(7)
    x = clustered(rng, 30, 512)
    with create(tmp_path, x, vectors="binary", keep="none", settings={"model_dim": 2048}) as col:
        assert CollectionProfile.from_manifest(col.manifest).is_matryoshka
    assert np.load(parts.vectors_path(tmp_path / "c", 0)).nbytes == 30 * 64


def test_search_functions_agree_with_brute_force():
    rng = np.random.default_rng(8)
    x, queries = clustered(rng, 300, 16), clustered(rng, 6, 16)
    ids = np.arange(1000, 1300)
    fetch = lambda found: x[found - 1000]  # noqa: E731
    scores, found = search.exact_search(queries, ids, 7, fetch, chunk_rows=64)
    reference = np.argsort(-(queries @ x.T), axis=1)[:, :7] + 1000
    assert np.array_equal(found, reference)
    allowed = ids[::3]
    flat = lambda q, k: search.top_k(q @ x.T, np.broadcast_to(ids, (len(q), len(ids))), k)  # noqa: E731
    s2, f2 = search.overfetch(flat, queries, 7, 7, len(ids), lambda f: np.isin(f, allowed))
    assert np.array_equal(f2, search.exact_search(queries, allowed, 7, fetch)[1])
    candidates = np.concatenate([found[:, ::-1], -np.ones((6, 2), dtype=np.int64)], axis=1)
    assert np.array_equal(search.rescore(queries, candidates, 3, fetch)[1], found[:, :3])


def test_rescore_scores_each_query_against_its_own_candidates():
    rng = np.random.default_rng(9)
    x, queries = clustered(rng, 200, 24), clustered(rng, 5, 24)
    fetch = lambda found: x[found]  # noqa: E731
    # Disjoint, overlapping, repeated-across-rows and padded candidate lists, in no order.
    candidates = np.array([[5, 3, 190, -1], [3, 4, 6, 7], [199, 0, -1, -1], [-1, -1, -1, -1], [7, 150, 5, 60]])
    scores, ids = search.rescore(queries, candidates, 3, fetch)
    for row in range(5):
        real = candidates[row][candidates[row] >= 0]
        exact = queries[row] @ x[real].T
        order = np.argsort(-exact, kind="stable")[:3]
        assert np.array_equal(ids[row, :len(order)], real[order])
        np.testing.assert_allclose(scores[row, :len(order)], exact[order], rtol=1e-5)
        assert np.all(ids[row, len(order):] == -1) and np.all(scores[row, len(order):] == -np.inf)


def test_reciprocal_rank_fusion_on_a_hand_built_case():
    dense = np.array([[10, 11, 12, -1]])
    lexical = np.array([[12, 13, 10, 14]])
    scores, ids, source = search.fuse_rrf([dense, lexical], k=5, constant=60)
    # 10: 1/61 + 1/63; 12: 1/63 + 1/61 (tie, dense first seen first); 11: 1/62; 13: 1/62; 14: 1/64.
    assert ids.tolist() == [[10, 12, 11, 13, 14]]
    assert np.isclose(scores[0, 0], 1 / 61 + 1 / 63) and np.isclose(scores[0, 4], 1 / 64)
    assert source.tolist() == [[3, 3, 1, 2, 2]]


@pytest.mark.parametrize("n,vectors,budget,expected", [
    (10_000, "int8", 4 * 2**30, "SQ8"),
    (200_000, "int8", 4 * 2**30, "HNSW32_SQ8"),
    (2_000_000, "int8", 8 * 2**30, "IVF4096_HNSW32,SQ8"),
    (10_000, "binary", 2**30, "BFlat"),
    (2_000_000, "binary", 2**30, "BIVF4096"),
    (10_000, "float16", 4 * 2**30, "SQfp16"),
])
def test_auto_learns_the_quantized_rungs(n, vectors, budget, expected):
    from faste_mm.indexers.faiss_index import auto_factory, factory_precision, validate_factory

    factory = auto_factory(n, 2048, budget, vectors)
    assert factory == expected and factory_precision(factory) == vectors
    validate_factory(factory, 2048, vectors)  # parses with FAISS


def test_filtered_search_of_a_binary_ivf_fills_k_from_the_matching_items(tmp_path):
    rng = np.random.default_rng(9)
    x, queries = clustered(rng, 2000, 64), clustered(rng, 5, 64)
    with Collection.create(tmp_path / "c", Manifest(model_id="m", dim=64, vectors="binary", keep="float",
                                                    index_type="BIVF16")) as col:
        col.add(x, [ItemRecord(uri=f"u{i}", modality="text", metadata={"b": i % 50}) for i in range(len(x))])
        scores, found = col.search(queries, k=10, where=SearchFilter(where={"b": 3}))
        assert col.info().index_factory == "BIVF16"
    allowed = np.arange(3, 2000, 50)
    assert np.all((found >= 0).sum(axis=1) == 10) and np.all(np.isin(found, allowed))
    reference = np.full((len(queries), len(x)), -np.inf, dtype=np.float32)
    reference[:, allowed] = queries @ x[allowed].T  # float16 parts: scores agree to ~1e-3
    kth = -np.sort(-reference, axis=1)[:, 9]
    assert np.all(np.take_along_axis(reference, found, axis=1) >= kth[:, None] - 2e-3)  # the exact top 10
    assert np.allclose(scores, np.take_along_axis(reference, found, axis=1), atol=2e-3)


def test_a_selective_filter_is_searched_exactly_over_the_matching_items(tmp_path):
    rng = np.random.default_rng(10)
    x, queries = clustered(rng, 3000, 32), clustered(rng, 4, 32)
    assert search.filter_is_selective(30, 3000) and not search.filter_is_selective(300, 3000)
    with Collection.create(tmp_path / "c", Manifest(model_id="m", dim=32, index_type="HNSW32")) as col:
        col.add(x, [ItemRecord(uri=f"u{i}", modality="text", metadata={"one": i % 100 == 7, "ten": i % 10 == 7})
                    for i in range(len(x))])
        stored = col.vectors(range(len(x)))
        for key in ("one", "ten"):  # 30 items: the exact path; 300: the selector path
            allowed = np.array([i for i in range(len(x)) if i % (100 if key == "one" else 10) == 7])
            scores, found = col.search(queries, k=5, where=SearchFilter(where={key: True}), ef_search=3000)
            reference = np.full((len(queries), len(x)), -np.inf, dtype=np.float32)
            reference[:, allowed] = queries @ stored[allowed].T
            same_sets_tolerating_ties(found, scores, reference, 5)


def test_a_retrievers_vectors_setting_follows_the_collection_and_a_conflict_is_refused(tmp_path):
    with Collection.create(tmp_path / "c", Manifest(model_id="m", dim=32, vectors="binary", keep="int8")) as col:
        profile = CollectionProfile.from_manifest(col.manifest)
    assert (profile.vectors, profile.keep) == ("binary", "int8")
    assert CollectionProfile.resolve(profile) == profile  # not given: the collection's
    assert CollectionProfile.resolve(None, vectors="int8").vectors == "int8"  # a new collection: the user's
    assert CollectionProfile.resolve(None).vectors == "float32"  # else the documented default
    with pytest.raises(CollectionError, match="--vectors.*binary.*int8"):
        CollectionProfile.resolve(profile, vectors="int8")
    manifest = profile.to_manifest(base=col.manifest)
    assert (manifest.vectors, manifest.keep, manifest.int8_ranges) == ("binary", "int8", col.manifest.int8_ranges)

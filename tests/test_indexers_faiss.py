"""FAISS index kinds: auto heuristic tiers, IVF / HNSW / PQ factory strings, training fallback."""

from __future__ import annotations

import numpy as np
import pytest

from faste_mm.indexers import Collection, ItemRecord, Manifest, auto_factory
from faste_mm.indexers.faiss_index import min_training_vectors, validate_factory

GiB = 2**30


def clustered(rng: np.random.Generator, n: int, d: int, n_clusters: int = 40) -> np.ndarray:
    """Unit vectors around random centres: the structure real embeddings have and IVF needs."""
    centres = rng.standard_normal((n_clusters, d)).astype(np.float32)
    x = centres[rng.integers(0, n_clusters, n)] + 0.3 * rng.standard_normal((n, d)).astype(
        np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def recall(found: np.ndarray, exact: np.ndarray) -> float:
    k = exact.shape[1]
    return float(np.mean([len(set(a) & set(b)) / k for a, b in zip(found, exact)]))


def build(tmp_path, vectors: np.ndarray, index_type: str) -> Collection:
    col = Collection.create(tmp_path / "c", Manifest(model_id="m", dim=vectors.shape[1],
                                                     index_type=index_type))
    col.add(vectors, [ItemRecord(uri=f"u{i}", modality="text") for i in range(len(vectors))])
    return col


def exact_top_k(col: Collection, queries: np.ndarray, n: int, k: int) -> np.ndarray:
    return np.argsort(-(queries @ col.vectors(range(n)).T), axis=1)[:, :k]


@pytest.mark.parametrize("n,d,budget,expected", [
    (1_000, 2048, 4 * GiB, "Flat"),
    (49_999, 2048, 4 * GiB, "Flat"),
    (100_000, 2048, 4 * GiB, "HNSW32"),
    (2_000_000, 2048, 64 * GiB, "IVF4096_HNSW32,Flat"),
    (2_000_000, 2048, 5 * GiB, "IVF4096_HNSW32,SQ8"),  # floats do not fit, 8-bit codes do (rescored)
    (2_000_000, 2048, 3 * GiB, "OPQ256_1024,IVF4096_HNSW32,PQ256x8np"),
    (100_000_000, 2048, 4 * GiB, "OPQ16_64,IVF32768_HNSW32,PQ16x8np"),
])
def test_auto_factory_tiers_are_valid_factory_strings(n, d, budget, expected):
    factory = auto_factory(n, d, budget)
    assert factory == expected
    validate_factory(factory, d)  # parses with FAISS, so `auto` never emits a bad string


def test_auto_factory_respects_a_small_memory_budget():
    # 40k x 2048 float32 is 328 MB: over a 256 MiB budget, so not Flat even though n is small;
    # its 8-bit codes (82 MB) fit, and under a 64 MiB budget only PQ codes do.
    assert auto_factory(40_000, 2048, 256 * 2**20) == "SQ8"
    assert auto_factory(40_000, 2048, 64 * 2**20).startswith("OPQ")


def test_min_training_vectors_reads_centroid_counts():
    assert min_training_vectors("Flat") == 1
    assert min_training_vectors("IVF1024_HNSW32,Flat") == 1024
    assert min_training_vectors("OPQ16_64,IVF64,PQ16x8") == 256


def test_ivf_with_all_lists_probed_matches_exact_search(tmp_path):
    rng = np.random.default_rng(0)
    x = clustered(rng, 3000, 32)
    with build(tmp_path, x, "IVF32,Flat") as col:
        queries = clustered(rng, 30, 32)
        _, found = col.search(queries, k=10, nprobe=32)
        assert col.info().index_factory == "IVF32,Flat"
        assert recall(found, exact_top_k(col, queries, 3000, 10)) == 1.0
        _, default = col.search(queries, k=10)  # default nprobe (8 of 32 lists)
        assert recall(default, exact_top_k(col, queries, 3000, 10)) >= 0.9


def test_ivf_hnsw_quantizer_and_hnsw_reach_high_recall(tmp_path):
    rng = np.random.default_rng(1)
    x = clustered(rng, 3000, 32)
    queries = clustered(rng, 30, 32)
    with build(tmp_path, x, "IVF32_HNSW32,Flat") as col:
        exact = exact_top_k(col, queries, 3000, 10)
        assert recall(col.search(queries, k=10, nprobe=16)[1], exact) >= 0.95
        assert col.rebuild_index("HNSW32") == "HNSW32"
        assert recall(col.search(queries, k=10)[1], exact) >= 0.95
        # efSearch below k is raised to k, so HNSW still returns k results.
        assert (col.search(queries, k=50, ef_search=8)[1] >= 0).all()


def test_pq_factory_trains_and_finds_exact_duplicates(tmp_path):
    rng = np.random.default_rng(2)
    x = clustered(rng, 2000, 32)
    with build(tmp_path, x, "IVF16,PQ16x8np") as col:
        _, found = col.search(col.vectors(range(20)), k=5, nprobe=16)
        assert np.mean([i in row for i, row in enumerate(found)]) >= 0.9


def test_factory_needing_more_training_vectors_searches_exactly_until_it_can_train(tmp_path, caplog):
    rng = np.random.default_rng(3)
    with build(tmp_path, clustered(rng, 10, 16), "IVF64,Flat") as col:
        _, found = col.search(col.vectors(range(10)), k=1)
        np.testing.assert_array_equal(found[:, 0], np.arange(10))
        assert col.info().index_factory == "Flat"
        warnings = [r for r in caplog.records if "needs at least 64 vectors" in r.getMessage()]
        assert len(warnings) == 1  # once per fallback build, not once per factory lookup
        col.add(clustered(rng, 3000, 16), [ItemRecord(uri=f"v{i}", modality="text")
                                           for i in range(3000)])
    # At close the collection has enough vectors and switches to the requested index.
    with Collection.open(tmp_path / "c") as reader:
        assert reader.manifest.index_factory == "IVF64,Flat"
        _, found = reader.search(reader.vectors(range(10)), k=1, nprobe=64)
        np.testing.assert_array_equal(found[:, 0], np.arange(10))


@pytest.mark.parametrize("factory", ["Flat", "SQ8", "SQfp16"])
def test_reserve_allocates_a_flat_index_once_and_keeps_its_results(factory):
    import faiss

    from faste_mm.indexers import faiss_index

    rng = np.random.default_rng(3)
    x = rng.standard_normal((600, 16)).astype(np.float32)
    ids = np.arange(100, 700)
    built = []
    for reserved in (True, False):
        index = faiss.IndexIDMap2(faiss.index_factory(16, factory, faiss.METRIC_INNER_PRODUCT))
        index.train(x)
        if reserved:
            assert faiss_index.reserve(index, len(x))
        core = faiss.downcast_index(index.index)
        assert core.ntotal == 0 and core.codes.size() == 0
        index.add_with_ids(x[:7], ids[:7])
        first = int(core.codes.data())
        index.add_with_ids(x[7:], ids[7:])
        if reserved:  # the codes never moved: no doubling copy held beside them
            assert int(core.codes.data()) == first
        built.append(index.search(x[:5], 4))
    assert np.array_equal(built[0][1], built[1][1]) and np.array_equal(built[0][0], built[1][0])


def test_reserve_leaves_other_index_kinds_alone():
    import faiss

    from faste_mm.indexers import faiss_index

    assert not faiss_index.reserve(faiss.IndexBinaryIDMap2(faiss.index_binary_factory(16, "BFlat")), 10)
    assert not faiss_index.reserve(faiss.IndexIDMap2(faiss.index_factory(16, "HNSW32")), 10)
    filled = faiss.IndexIDMap2(faiss.index_factory(16, "Flat"))
    filled.add_with_ids(np.ones((2, 16), dtype=np.float32), np.arange(2))
    assert not faiss_index.reserve(filled, 10)  # only an empty index: its codes would be dropped

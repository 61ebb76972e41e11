"""near_pairs (faste_mm/retrieval/library/near_pairs.py), array in, array out: the pairs it finds equal a
brute-force Gram matrix's on clustered vectors at several thresholds and widths, with vectors
longer and shorter than unit; the sketch radius is the binomial tail it claims."""

from __future__ import annotations

import math

import numpy as np
import pytest

from faste_mm.retrieval.library.near_pairs import candidate_pairs, hamming_radius, near_pairs, sketch_cosine, sketches, directions


def _clustered(seed: int, n: int, dim: int, noise: float) -> np.ndarray:
    """Unit vectors: a third of them near copies (noise `noise`) of another row, the rest random."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, dim)).astype(np.float32)
    copies = rng.choice(n, n // 3, replace=False)
    x[copies] = x[rng.integers(0, n, len(copies))] + rng.normal(scale=noise, size=(len(copies), dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _brute_force(x: np.ndarray, threshold: float) -> set[tuple[int, int]]:
    first, second = np.nonzero(np.triu(x @ x.T >= threshold, 1))
    return set(zip(first.tolist(), second.tolist()))


@pytest.mark.parametrize("dim,noise,threshold", [(16, 0.08, 0.9), (64, 0.05, 0.95), (256, 0.03, 0.98), (2048, 0.01, 0.95)])
def test_pairs_equal_the_brute_force_gram_matrix(dim, noise, threshold):
    x = _clustered(dim, 1500, dim, noise * math.sqrt(64 / dim))
    first, second, scores = near_pairs(x, threshold)
    expected = _brute_force(x, threshold)
    assert len(expected) > 100  # the data has near pairs to find
    assert set(zip(first.tolist(), second.tolist())) == expected
    assert (first < second).all() and len(set(zip(first.tolist(), second.tolist()))) == len(first)
    np.testing.assert_allclose(scores, np.einsum("ij,ij->i", x[first], x[second]), rtol=1e-5)


@pytest.mark.parametrize("scale", [0.8, 1.25])
def test_vectors_off_unit_length_lose_no_pair(scale):
    """Inner products, not cosines, meet the threshold: the sketch radius widens for longer vectors."""
    x = _clustered(7, 900, 32, 0.15)
    x[::2] *= scale
    threshold = 0.8
    first, second, _ = near_pairs(x, threshold)
    assert set(zip(first.tolist(), second.tolist())) == _brute_force(x, threshold)


def test_no_pair_when_none_can_reach_the_threshold_and_for_tiny_inputs():
    x = _clustered(1, 50, 8, 0.01) * 0.5  # inner products <= 0.25
    assert sketch_cosine(0.5, 0.5) > 1.0
    assert all(len(a) == 0 for a in near_pairs(x, 0.5))
    assert all(len(a) == 0 for a in near_pairs(x[:1], 0.5))
    assert all(len(a) == 0 for a in near_pairs(np.zeros((0, 8), np.float32), 0.5))


def test_candidate_blocks_compare_each_pair_once():
    codes = sketches(_clustered(3, 300, 16, 0.05), directions(16))
    one_block = candidate_pairs(codes, 0.8, block_rows=1000)
    small_blocks = candidate_pairs(codes, 0.8, block_rows=128)
    assert [a.tolist() for a in one_block] == [a.tolist() for a in small_blocks]


def test_a_low_threshold_shrinks_the_blocks_and_loses_no_pair(monkeypatch):
    """Where most pairs pass the sketch scan, blocks get fewer rows (bounded memory), same pairs."""
    import faste_mm.retrieval.library.near_pairs as near

    x = _clustered(5, 1200, 32, 0.3)
    codes = sketches(x, directions(32))
    monkeypatch.setattr(near, "MAX_BLOCK_MATCHES", 50_000)
    low, high = (hamming_radius(0.2, 128, 5e-7), hamming_radius(0.2, 256, 5e-7)), \
        (hamming_radius(0.99, 128, 5e-7), hamming_radius(0.99, 256, 5e-7))
    assert near._block_rows(codes, 16, *low) < 200
    assert near._block_rows(codes, 16, *high) == near.QUERY_BLOCK_ROWS
    first, second, _ = near_pairs(x, 0.2)
    assert set(zip(first.tolist(), second.tolist())) == _brute_force(x, 0.2)


@pytest.mark.parametrize("cosine", [0.8, 0.95, 0.99])
def test_radius_is_the_least_with_the_binomial_tail_below_the_miss_probability(cosine):
    bits, miss = 256, 1e-6
    p = math.acos(cosine) / math.pi
    tail = lambda h: sum(math.comb(bits, k) * p ** k * (1 - p) ** (bits - k) for k in range(h + 1, bits + 1))  # noqa: E731
    h = hamming_radius(cosine, bits, miss)
    assert tail(h) <= miss < tail(h - 1)
    assert hamming_radius(1.0, bits, miss) == 0

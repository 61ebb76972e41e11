"""Pairs of vectors whose inner product reaches a threshold, without scoring every pair in full.
Array in, array out (tested against a brute-force Gram matrix): `near_pairs(x, threshold)` hands
back (first rows, second rows, scores), each pair once (first < second); `duplicates` feeds it a
collection's stored vectors.

Why not the collection's FAISS index: a range search walks the HNSW graph once per item (~0.9 ms
an item at d=256, 94 s for 100k; vectors of d=2048 are 8x wider, and there FAISS 1.15.1's HNSW
range search aborted, docs/performance.md); a flat scan of every pair costs n^2 * d
multiply-adds (100k x 2048: ~10^13). Here each vector gets a sketch of
SKETCH_BITS bits, the signs of its products with fixed random Gaussian directions (Charikar's
SimHash): two vectors at angle theta differ in each bit with probability theta / pi, whatever the
data, so the bits in which a pair at the threshold differs follow Binomial(bits, acos(t) / pi).
FAISS's binary range search compares the first SCAN_BITS of every pair's sketches (16 bytes a
pair, all of them in cache), the pairs within that radius are compared on all their bits, and
those within `hamming_radius` of both (beyond which a pair at the threshold lies with probability
< MISS_PROBABILITY / 2 each; a pair above the threshold less often still) are scored exactly from
the vectors. Far pairs never reach the exact stage, so it costs what the near pairs do.
"""

from __future__ import annotations

import logging
import math
from typing import Callable, Iterator

import numpy as np

log = logging.getLogger(__name__)

# Sketch width: at the default threshold 0.95 a pair at the threshold differs in ~26 of 256 bits
# (radius 52 at MISS_PROBABILITY / 2) and an unrelated pair (cosine ~0.3) in ~103, so almost no
# far pair reaches the exact stage (scoring a pair exactly reads two 8 KiB vectors at d=2048).
SKETCH_BITS = 256
# Bits of each sketch compared over every pair (FAISS: ~1 ns a pair at 128 bits, ~1.7 at 256, on
# this 2-core Xeon); the candidates within their radius (~2 in 10,000 unrelated pairs at cosine 0.3)
# are compared on all SKETCH_BITS.
SCAN_BITS = 128
# Chance that a pair exactly at the threshold is missed (a pair above it: less); a missed pair
# rarely splits a group, whose members are usually joined by several pairs.
MISS_PROBABILITY = 1e-6
# Sketches searched as one query block (FAISS splits a block's rows over the cores); each block is
# compared with itself and every later row only, so each pair is looked at once.
QUERY_BLOCK_ROWS = 8192
# A block's range-search matches aimed at (12 bytes each in FAISS's result, more as numpy rows);
# at the default threshold a block of QUERY_BLOCK_ROWS holds far fewer.
MAX_BLOCK_MATCHES = 20_000_000
MIN_BLOCK_ROWS = 64
SAMPLED_PAIRS = 20_000  # random pairs that estimate the share passing the scan
MANY_EXACT_PAIRS = 20_000_000  # pairs to score exactly past which a warning says it takes long (minutes)
# Candidate pairs scored exactly at a time (their vectors gathered: bounded memory).
VERIFY_PAIRS = 65_536
SEED = 20_261_126
_POPCOUNT = np.array([bin(byte).count("1") for byte in range(256)], dtype=np.uint8)


def directions(dim: int, bits: int = SKETCH_BITS, seed: int = SEED) -> np.ndarray:
    """The fixed random Gaussian directions [dim, bits] float32 the sketches project onto."""
    return np.random.default_rng(seed).standard_normal((dim, bits), dtype=np.float32)


def sketches(x: np.ndarray, planes: np.ndarray) -> np.ndarray:
    """Sketches [n, bits / 8] uint8 of vectors x [n, dim]: bit j set where x . planes[:, j] > 0."""
    return np.packbits(np.asarray(x, dtype=np.float32) @ planes > 0, axis=1)


def hamming_radius(cosine: float, bits: int = SKETCH_BITS, miss: float = MISS_PROBABILITY) -> int:
    """The least h such that a pair at `cosine` differs in more than h of `bits` sketch bits with
    probability <= `miss` (the binomial tail of Binomial(bits, acos(cosine) / pi))."""
    p = math.acos(min(1.0, max(-1.0, cosine))) / math.pi
    tail = 1.0  # P(X > h), from h = -1 on
    for h in range(bits + 1):
        tail -= math.comb(bits, h) * p ** h * (1.0 - p) ** (bits - h)
        if tail <= miss:
            return h
    return bits


def candidate_blocks(codes: np.ndarray, cosine: float, miss: float = MISS_PROBABILITY,
                     block_rows: int | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(first rows, second rows) int64, first < second, block by block in first-row order, of the
    pairs of sketches `codes` [n, bytes] uint8 close enough for vectors at `cosine`: within the
    radius of their first SCAN_BITS bits (FAISS's binary range search over every pair: cheap
    bits), then of all their bits (numpy, on those candidates only). A pair at `cosine` fails
    either test with probability <= miss / 2. block_rows: query rows a block (None: as many as
    keep a block's range-search matches near MAX_BLOCK_MATCHES, estimated on sampled pairs: a low
    threshold lets many more pairs through the scan)."""
    import faiss

    codes = np.ascontiguousarray(codes, dtype=np.uint8)
    bits = codes.shape[1] * 8
    scan_bytes = min(SCAN_BITS, bits) // 8
    scan = np.ascontiguousarray(codes[:, :scan_bytes])
    scan_radius = hamming_radius(cosine, scan_bytes * 8, miss / 2)
    radius = hamming_radius(cosine, bits, miss / 2)
    block_rows = block_rows or _block_rows(codes, scan_bytes, scan_radius, radius)
    for start in range(0, len(codes), block_rows):
        index = faiss.IndexBinaryFlat(scan_bytes * 8)
        index.add(scan[start:])  # this block and the rows after it: each pair compared once
        lims, _, found = index.range_search(scan[start:start + block_rows], scan_radius + 1)  # FAISS keeps d < radius
        rows = np.repeat(np.arange(start, start + len(lims) - 1, dtype=np.int64), np.diff(lims.astype(np.int64)))
        partners = found.astype(np.int64) + start
        keep = partners > rows
        rows, partners = rows[keep], partners[keep]
        keep = hamming(codes[rows], codes[partners]) <= radius
        yield rows[keep], partners[keep]


def candidate_pairs(codes: np.ndarray, cosine: float, miss: float = MISS_PROBABILITY,
                    block_rows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Every block of `candidate_blocks`, joined."""
    blocks = [(np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)),
              *candidate_blocks(codes, cosine, miss, block_rows)]
    return np.concatenate([a for a, _ in blocks]), np.concatenate([b for _, b in blocks])


def _block_rows(codes: np.ndarray, scan_bytes: int, scan_radius: int, radius: int) -> int:
    """Query rows a block such that its expected range-search matches stay near MAX_BLOCK_MATCHES,
    from the share of SAMPLED_PAIRS random pairs within `scan_radius` of their first `scan_bytes`;
    a warning when the pairs left for exact scores (within `radius` of all bits) are many."""
    n = len(codes)
    if n < 2:
        return QUERY_BLOCK_ROWS
    rng = np.random.default_rng(SEED)
    a, b = rng.integers(0, n, SAMPLED_PAIRS), rng.integers(0, n, SAMPLED_PAIRS)
    share = (np.count_nonzero(hamming(codes[a, :scan_bytes], codes[b, :scan_bytes]) <= scan_radius) + 1) / SAMPLED_PAIRS
    exact = np.count_nonzero(hamming(codes[a], codes[b]) <= radius) / SAMPLED_PAIRS * n * (n - 1) / 2
    if exact > MANY_EXACT_PAIRS:
        log.warning("sketches: ~%.2g of the %.2g pairs are close enough to score exactly (a low threshold for "
                    "these vectors: near-duplicates score >= ~0.9); this takes long", exact, n * (n - 1) / 2)
    rows = int(MAX_BLOCK_MATCHES / (share * n / 2))
    return max(MIN_BLOCK_ROWS, min(QUERY_BLOCK_ROWS, rows))


def hamming(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Bits in which the rows of two sketch arrays [m, bytes] uint8 differ: [m] int64."""
    return _POPCOUNT[a ^ b].sum(axis=1, dtype=np.int64)  # a table: numpy < 2 has no bitwise_count


def verified_pairs(first: np.ndarray, second: np.ndarray, rows_of: Callable[[np.ndarray], np.ndarray],
                   threshold: float, batch: int = VERIFY_PAIRS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The candidate pairs whose exact inner product is >= threshold, with it: (first, second,
    scores float32). rows_of(sorted unique rows) -> their vectors [m, dim] float32."""
    kept: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = [
        (np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float32))]
    for start in range(0, len(first), batch):
        a, b = first[start:start + batch], second[start:start + batch]
        wanted, where = np.unique(np.concatenate([a, b]), return_inverse=True)
        vectors = rows_of(wanted)
        scores = np.einsum("ij,ij->i", vectors[where[:len(a)]], vectors[where[len(a):]])
        keep = scores >= threshold
        kept.append((a[keep], b[keep], scores[keep].astype(np.float32)))
    return tuple(np.concatenate(parts) for parts in zip(*kept))  # type: ignore[return-value]


def sketch_cosine(threshold: float, max_norm: float) -> float:
    """The cosine every pair scoring >= threshold reaches when no vector is longer than max_norm
    (x . y <= |x| |y| cos): the threshold itself for unit vectors, more for shorter ones; > 1
    means no pair can score that much."""
    return math.inf if max_norm <= 0 else threshold / (max_norm * max_norm)


def near_pairs(x: np.ndarray, threshold: float, bits: int = SKETCH_BITS,
               miss: float = MISS_PROBABILITY) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pairs of rows of x [n, dim] whose inner product is >= threshold: (first, second int64 with
    first < second, scores float32), each pair missed with probability <= `miss` (module docstring)."""
    x = np.asarray(x, dtype=np.float32)
    cosine = sketch_cosine(threshold, float(np.linalg.norm(x, axis=1).max(initial=0.0)))
    if len(x) < 2 or cosine > 1.0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float32)
    codes = sketches(x, directions(x.shape[1], bits))
    found = [verified_pairs(first, second, lambda rows: x[rows], threshold)
             for first, second in candidate_blocks(codes, cosine, miss)]  # block by block: bounded memory
    return joined(found)


def joined(parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Lists of (first, second, scores) joined into one (empty arrays for none)."""
    empty = (np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float32))
    return tuple(np.concatenate(column) for column in zip(empty, *parts))  # type: ignore[return-value]

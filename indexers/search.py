"""The collection's search path as array functions (arrays in, arrays out, like faiss contrib):
over-fetching past tombstones and filters, exact search over stored vectors, rescoring quantized
candidates, and reciprocal-rank fusion of a dense and a lexical list.

Rows are queries; scores are inner products (higher is better); -1 ids with -inf scores pad rows
that have fewer than k hits. Every function is checked against brute-force numpy in the tests.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import numpy as np

from faste_mm.errors import InputError

from faste_mm.indexers.records import ItemRecord

# Search a quantized index for k x this many candidates, then rescore them exactly from the stored
# copy, per index precision (measured by scripts/bench_scale.py, see docs/benchmarks-log.md: the
# smallest factor of 5/10/20/40 reaching recall@10 >= 0.95 on clustered 100k x 2048 vectors:
# binary 10 -> 0.89, 20 -> 1.00; int8 2 -> 0.999. PQ's 4 is not measured here).
DEFAULT_RESCORE = {"binary": 20, "pq": 4, "int8": 2, "float16": 1, "float32": 1}
# Reciprocal-rank fusion: score(item) = sum over lists of 1 / (RRF_K + rank), rank from 1
# (Cormack et al., 2009, whose k = 60 Elasticsearch, OpenSearch and Qdrant use too).
RRF_K = 60
MODES = ("dense", "lexical", "hybrid")
# A filter matching under this share of the items (and at most EXACT_FILTER_MAX_ITEMS) is searched
# exactly over their stored vectors, not through the index: an HNSW graph walked with a selector
# of 1% of 100k items took 820 ms a query (scripts/bench_scale.py), reading 1,000 memory-mapped
# rows a few ms (Qdrant's full-scan threshold is the same idea).
EXACT_FILTER_SHARE = 0.02
EXACT_FILTER_MAX_ITEMS = 20_000


# A selective filter on a quantized index rescores at least this share of its matches (or k x rescore
# when more), per index precision: sign bits rank the matches of a filter worse than the neighbours of
# an unfiltered search, which sit in the query's own cluster. 1% filter (10,000 matches), recall@10 of
# the rescored candidates: binary at 1M x 2048, 200 (k x 20) 0.69, 1,000 0.91, 2,000 0.98, 3,000 0.99;
# at 1M x 512, 3,000 0.97, 4,000 0.99, 5,000 0.997 (each 1,000 more rows ~2 ms at 512 dims). int8's
# 20 candidates already reach 0.997 at 1M x 512 (its codes rank well): no share. Below the second
# number every match is rescored: 2,000 float16 rows of 2048 dims read in ~8-16 ms (at 100k x 2048 the
# share alone, 300 of 1,000 matches, gave recall 0.946; all 1,000, 0.998 at 2x the unfiltered search).
FILTER_RESCORE_SHARE = {"binary": (0.3, 2_000)}  # precision: (share of the matches, all of them below)


def filter_is_selective(n_allowed: int, n_total: int) -> bool:
    """Whether a filter admitting `n_allowed` of `n_total` items is searched exactly (see above)."""
    return n_allowed < EXACT_FILTER_SHARE * n_total and n_allowed <= EXACT_FILTER_MAX_ITEMS
# Which side found a hit (`Found.sources`, a bitmask): the dense list, the lexical list, or both.
FOUND_DENSE, FOUND_LEXICAL = 1, 2
FOUND_FILTERS = 4  # listed by its filters alone (a query of filters only: `Collection.newest`)
SOURCE_NAMES = {FOUND_DENSE: "dense", FOUND_LEXICAL: "lexical", FOUND_DENSE | FOUND_LEXICAL: "both",
                FOUND_FILTERS: "filters"}


def hybrid_depth(k: int) -> int:
    """How deep each side's list is fetched for fusing into k hits: RRF needs the items ranked
    past k on one side that the other side ranks high (5k, at least 50: Elasticsearch's default
    rank window of RRF is max(50, k) too)."""
    return max(50, 5 * k)


def check_query_text(text: str, nul: bool = True) -> None:
    """InputError for a query text that cannot be searched: an unpaired surrogate (not Unicode: it
    has no UTF-8 form, no tokenizer or SQLite takes it) or, in an FTS5 expression (`nul`), a NUL
    character (FTS5 reads the text up to it; plain words split at it), naming its position."""
    position = text.find("\0") if nul else -1
    if position >= 0:
        raise InputError(f"the query text holds a NUL character (\\x00) at position {position}; remove it")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise InputError(f"the query text holds an unpaired surrogate ({text[error.start]!a}) at position "
                         f"{error.start}, which is not a Unicode character; send valid UTF-8 text") from None


def fts_query(text: str) -> str:
    """A user's words as an FTS5 expression that cannot fail to parse: each whitespace-separated
    chunk holding a letter or digit becomes a quoted phrase (quotes doubled), joined by OR, so
    quotes, asterisks, colons, parentheses and operators are searched as the words they hold
    ("INV-2024-001" is the phrase inv 2024 001). Empty when the text holds no word."""
    chunks = [c for c in text.replace("\0", " ").split() if re.search(r"\w", c)]  # FTS5 stops at a NUL
    return " OR ".join('"' + c.replace('"', '""') + '"' for c in chunks)


@dataclass(frozen=True, slots=True, eq=False)
class Found:
    """Hits of `Collection.find`: scores and ids [q, k] (best first, -inf / -1 padding; hybrid
    scores are fused RRF scores, lexical ones -bm25), sources [q, k] (FOUND_* bitmask, 0 for
    padding), the records of the ids found and, in hybrid mode, each hit's cosine with its query
    [q, k] (a fused score says nothing of how close a hit is; None in the other modes, where the
    score is that cosine or has none)."""

    scores: np.ndarray
    ids: np.ndarray
    sources: np.ndarray
    records: dict[int, ItemRecord]
    similarities: np.ndarray | None = None

SearchFn = Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray]]  # (queries, k) -> (scores, ids)
FetchFn = Callable[[np.ndarray], np.ndarray]  # ids [n] -> float32 vectors [n, d]


def empty_hits(q: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(scores [q, k] of -inf, ids [q, k] of -1)."""
    return np.full((q, k), -np.inf, dtype=np.float32), np.full((q, k), -1, dtype=np.int64)


def top_k(scores: np.ndarray, ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best (score, id) of each row [q, c] (stable: ties keep their order), padded to k."""
    out_s, out_i = empty_hits(len(scores), k)
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    width = order.shape[1]
    out_s[:, :width] = np.take_along_axis(scores, order, axis=1)
    out_i[:, :width] = np.take_along_axis(ids, order, axis=1)
    out_i[~np.isfinite(out_s)] = -1
    return out_s, out_i


def overfetch(search: SearchFn, queries: np.ndarray, k: int, k_fetch: int, ntotal: int,
              keep: Callable[[np.ndarray], np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The best `k` hits of `search` per query that `keep` ([p, f] ids -> bool mask) accepts:
    fetch `k_fetch` per query, then 4x more for the queries still short of k, up to `ntotal`."""
    scores, ids = empty_hits(len(queries), k)
    pending = np.arange(len(queries))
    while len(pending):
        D, I = search(queries[pending], k_fetch)
        kept = keep(I) & (I >= 0)
        # Stable sort moves kept hits to the front while keeping the index's score order.
        order = np.argsort(~kept, axis=1, kind="stable")[:, :k]  # [p, min(k, k_fetch)]
        take = np.take_along_axis(kept, order, axis=1)
        width = order.shape[1]
        ids[pending, :width] = np.where(take, np.take_along_axis(I, order, axis=1), -1)
        scores[pending, :width] = np.where(take, np.take_along_axis(D, order, axis=1), -np.inf)
        if k_fetch >= ntotal:
            break
        pending = pending[kept.sum(axis=1) < k]
        k_fetch = min(ntotal, 4 * k_fetch)
    return scores, ids


def exact_search(queries: np.ndarray, candidates: np.ndarray, k: int, fetch: FetchFn,
                 chunk_rows: int = 16_384) -> tuple[np.ndarray, np.ndarray]:
    """Brute-force top-k of `queries` [q, d] over the vectors of `candidates` [n] (ids), read by
    `fetch` a chunk at a time (memory bounded by `chunk_rows`): (scores, ids) [q, k]."""
    best_s, best_i = empty_hits(len(queries), k)
    for start in range(0, len(candidates), chunk_rows):
        chunk = candidates[start:start + chunk_rows]
        s = np.concatenate([best_s, queries @ fetch(chunk).T], axis=1)  # [q, k + c]
        i = np.concatenate([best_i, np.broadcast_to(chunk, (len(queries), len(chunk)))], axis=1)
        best_s, best_i = top_k(s, i, k)
    return best_s, best_i


def rescore(queries: np.ndarray, candidates: np.ndarray, k: int, fetch: FetchFn) -> tuple[np.ndarray, np.ndarray]:
    """Score the candidate ids [q, c] (-1 = none) of each query [q, d] exactly by the vectors
    `fetch` returns and keep the k best: (scores, ids) [q, k], best first."""
    found = np.unique(candidates[candidates >= 0])
    if len(found) == 0:
        return empty_hits(len(queries), k)
    vectors = fetch(found)  # [u, d], each candidate read once
    rows = np.searchsorted(found, np.maximum(candidates, 0))  # [q, c] row of each candidate
    scores = np.empty(candidates.shape, dtype=np.float32)
    # Each query against its own c candidates only: a batch's candidate lists barely overlap, so one
    # [q, u] product would do q times the work (32x for a batch of 32). einsum, not BLAS: a product
    # this small gains nothing from BLAS threads, and on a loaded machine waiting for a descheduled
    # one cost 13 ms per call instead of 0.4 ms (docs/benchmarks-log.md).
    for row in range(len(queries)):
        scores[row] = np.einsum("cd,d->c", vectors[rows[row]], queries[row])
    scores = np.where(candidates >= 0, scores, -np.inf).astype(np.float32)
    return top_k(scores, candidates, k)


def fuse_rrf(lists: list[np.ndarray], k: int, constant: int = RRF_K) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Reciprocal-rank fusion of ranked id lists (each [q, n_i], best first, -1 = none) into the
    top k per query: (fused scores [q, k], ids [q, k], source [q, k] bitmask: bit i set when list
    i holds the id). Ties keep the order of first appearance (dense list first)."""
    q = len(lists[0])
    out_s, out_i = empty_hits(q, k)
    source = np.zeros((q, k), dtype=np.int64)
    for row in range(q):
        score: dict[int, float] = {}
        bits: dict[int, int] = {}
        for which, ranked in enumerate(lists):
            for rank, item in enumerate(ranked[row]):
                if item < 0:
                    continue
                item = int(item)
                score[item] = score.get(item, 0.0) + 1.0 / (constant + rank + 1)
                bits[item] = bits.get(item, 0) | (1 << which)
        best = sorted(score, key=lambda i: -score[i])[:k]  # sorted() is stable
        out_i[row, :len(best)] = best
        out_s[row, :len(best)] = [score[i] for i in best]
        source[row, :len(best)] = [bits[i] for i in best]
    return out_s, out_i, source

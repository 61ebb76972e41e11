"""The collection's read path over one snapshot: dense hits through the derived index (past
tombstones and filters, rescored from the stored copy when the index holds coarser codes), lexical
hits from SQLite's BM25, and the snapshot loop both run in. Receives the store, the derived index
and a fetcher of stored vectors; hands back (scores [q, k], ids [q, k]) arrays, -inf / -1 padded.
`Collection.search` and `Collection.find` are the entry points; the array work is `search`.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from faste_mm.errors import CollectionError, ConfigError
from faste_mm.indexers import faiss_index, parts, quantization, search
from faste_mm.indexers.derived_index import DerivedIndex
from faste_mm.indexers.filters import SearchFilter
from faste_mm.indexers.store import MetaStore

log = logging.getLogger(__name__)

# A reader retries this often when compacts keep replacing the parts under its snapshot.
SNAPSHOT_ATTEMPTS = 5


@dataclass(frozen=True, slots=True, eq=False)
class PlainSnapshot:
    """What an unfiltered snapshot found (`unchanged_hits` may skip the next one while the store,
    its version and the index object are these): the index current, no tombstoned vector."""

    store: MetaStore
    version: tuple[int, int]
    index: object  # the FAISS index object searched
    rescores: bool  # whether that index's default search rescores (then it reads SQLite)


def unchanged_hits(plain: PlainSnapshot | None, store: MetaStore, index: DerivedIndex, queries: np.ndarray, k: int,
                   nprobe: int | None, ef_search: int | None, rescore: int | None) -> tuple[np.ndarray, np.ndarray] | None:
    """An unfiltered search that reads nothing from SQLite (no rescoring), without a transaction,
    when the file's version is still that of the last unfiltered snapshot (`plain`), which found
    this index current and no tombstoned vector in it: one PRAGMA instead of BEGIN, PRAGMA, COMMIT
    and the snapshot's bookkeeping (~0.05 ms of a 0.5 ms HNSW search after other work evicted the
    caches, docs/benchmarks-log.md). A commit landing during the FAISS search is as if it came
    after, as for a search in a snapshot. None when it cannot (the caller searches in a snapshot)."""
    if plain is None or plain.store is not store or plain.index is not index.index \
            or (plain.rescores and rescore != 0) or store.db.in_transaction:
        return None
    if rescore is not None and (not isinstance(rescore, int) or rescore < 0):
        return None  # the snapshot's path words the error
    if store.version() != plain.version:
        return None
    return live_hits(index, queries, k, nprobe, ef_search)


def in_snapshot(store: MetaStore, root: Path, run: Callable[[], tuple], retry: bool,
                records: bool = True) -> tuple:
    """`run()` (arrays whose second is ids [q, k]) and the records of the ids found ({} when not
    `records`: a caller wanting only ids and scores skips reading and parsing them), read in
    one snapshot of the collection: a search running while a writer adds, deletes or compacts
    sees the rows and parts of one moment, and never returns an item tombstoned before it.

    A compact that replaces the parts after the snapshot began unlinks files the snapshot
    lists; the search then starts over on the newer parts (a few times at most; `retry` False
    for a writer, under whom no compact can run)."""
    for attempt in range(SNAPSHOT_ATTEMPTS):
        with store.read_snapshot():
            epoch = store.state()["epoch"]
            try:
                result = run()
                ids = result[1]
                if not records:
                    return (*result, {})
                return (*result, store.records(sorted({int(i) for i in ids[ids >= 0]})))
            except parts.PartMissing:
                if not retry or attempt == SNAPSHOT_ATTEMPTS - 1:
                    raise
        if store.state()["epoch"] == epoch:  # no compact since: the file is really gone
            raise CollectionError(f"{root}: a vector part is missing; the collection is damaged — "
                                  f"re-index it with `--reindex`")
        log.debug("%s: parts of epoch %d replaced during a search; searching again", root, epoch)
    raise AssertionError("unreachable")


def rescores(factory: str | None, stored_precision: str) -> bool:
    """Whether the stored vectors score more exactly than the index (quantized or PQ codes)."""
    return quantization.rescores(faiss_index.factory_precision(factory or "Flat"), stored_precision)


def oversample(rescore: int | None, factory: str | None, stored_precision: str) -> int:
    """Candidates per wanted hit: `rescore` (0 = no rescoring), else the index precision's default."""
    if rescore is not None and (not isinstance(rescore, int) or rescore < 0):
        raise ConfigError(f"rescore must be an int >= 0 (candidates per hit; 0 = none), got {rescore!r}")
    if not rescores(factory, stored_precision) or rescore == 0:
        return 1
    return rescore or search.DEFAULT_RESCORE[faiss_index.factory_precision(factory or "Flat")]


def fusion_rescore(rescore: int | None, k: int, depth: int, factory: str | None, stored_precision: str) -> int | None:
    """The rescore factor of a dense list fetched `depth` deep for fusing into k hits: a list
    rescored k x N deep reads as many stored rows as a dense top-k does, and the ranks past that
    matter to reciprocal-rank fusion only coarsely (binary at 1M, depth 50, N 20: 1,000 rows a
    query -> 200; hybrid p50 221 -> 109 ms, same fused top-10 in 12 of 12 queries)."""
    if not rescores(factory, stored_precision) or rescore == 0:
        return rescore
    return max(1, -(-k * oversample(rescore, factory, stored_precision) // depth))


def dense_hits(derived: DerivedIndex, store: MetaStore, queries: np.ndarray, k: int, nprobe: int | None,
               ef_search: int | None, where: SearchFilter | None, rescore: int | None, stored_precision: str,
               fetch: search.FetchFn) -> tuple[np.ndarray, np.ndarray]:
    """Stage 1: the index's best `k x oversample` live (and matching) candidates; stage 2, when
    the stored copy is finer than the index's codes: rescore them exactly from it (`fetch`: ids ->
    stored vectors). `derived` must be current (`DerivedIndex.current`)."""
    index = derived.index
    if index.ntotal == 0 or len(queries) == 0:
        return search.empty_hits(len(queries), k)
    k_index = k * oversample(rescore, derived.factory, stored_precision)

    def search_index(q: np.ndarray, k_fetch: int, allowed: np.ndarray | None = None):
        return derived.search(q, k_fetch, nprobe, ef_search, allowed=allowed)

    if where is not None and not where.is_empty:
        allowed = store.filtered_ids(where)
        if search.filter_is_selective(len(allowed), index.ntotal):
            return _selective_hits(derived, queries, k, k_index, allowed, fetch,
                                   rescores(derived.factory, stored_precision) and rescore != 0)
        scores, ids = _filtered_hits(derived, queries, k_index, search_index, allowed, fetch)
    elif store.n_tombstoned_vectors() == 0:  # every vector in the index is live: its hits as they are
        scores, ids = live_hits(derived, queries, k_index, nprobe, ef_search)
    else:
        # Over-fetch past the tombstones; then grow 4x for queries still short of k.
        def is_live(found: np.ndarray) -> np.ndarray:
            live = store.live_ids(np.unique(found[found >= 0]).tolist())
            return np.isin(found, np.fromiter(live, dtype=np.int64, count=len(live)))

        scores, ids = search.overfetch(search_index, queries, k_index, min(index.ntotal, 2 * k_index), index.ntotal,
                                       is_live)
    if rescores(derived.factory, stored_precision) and rescore != 0:
        return search.rescore(queries, ids, k, fetch)
    return scores, ids


def live_hits(derived: DerivedIndex, queries: np.ndarray, k: int, nprobe: int | None,
              ef_search: int | None) -> tuple[np.ndarray, np.ndarray]:
    """The index's own top k, for an index every vector of which is live (no tombstone in it):
    (scores, ids) [q, k], padded past its size. Reads nothing from SQLite."""
    ntotal = derived.index.ntotal
    if ntotal == 0 or len(queries) == 0:
        return search.empty_hits(len(queries), k)
    if k <= ntotal:
        return derived.search(queries, k, nprobe, ef_search)
    return search.top_k(*derived.search(queries, ntotal, nprobe, ef_search), k)  # pads to k


def _selective_hits(derived: DerivedIndex, queries: np.ndarray, k: int, k_index: int, allowed: np.ndarray,
                    fetch: search.FetchFn, rescoring: bool) -> tuple[np.ndarray, np.ndarray]:
    """The top k among the few live ids `allowed` (a selective filter's matches, sorted), every match
    scored (no graph or probed lists to miss one):
    - where FAISS can score the index's codes under an id selector (Flat, SQ8, BFlat, an HNSW graph's
      storage, IVF Flat or SQ with every list probed: `DerivedIndex.search_matches`): the best among the
      matches by those codes; exact where the codes are the decoded parts (Flat, HNSW over Flat, IVF Flat),
      else rescored from the stored copy, `k_index` candidates or the precision's
      `search.FILTER_RESCORE_SHARE` of the matches, whichever is more (all of a few);
    - otherwise exactly over the stored vectors of the matches: from the index's float copy in RAM, or
      read from the parts (at 1M x 512, 10,000 float16 rows: ~35 ms, where the scan under a selector takes
      2-4 ms; 1,000 rows of 2048 dims gathered from RAM ~10 ms, scored under the selector ~1.6 ms)."""
    if rescoring:
        share, every_below = search.FILTER_RESCORE_SHARE.get(faiss_index.factory_precision(derived.factory or "Flat"),
                                                              (0.0, 0))
        depth = max(k_index, math.ceil(share * len(allowed)), min(len(allowed), every_below))
    else:
        depth = k
    found = derived.search_matches(queries, allowed, depth)
    if found is not None:
        return search.rescore(queries, found[1], k, fetch) if rescoring else found
    return search.exact_search(queries, allowed, k, derived.exact_fetch(allowed) or fetch)


def _filtered_hits(derived: DerivedIndex, queries: np.ndarray, k: int, search_index, allowed: np.ndarray,
                   fetch: search.FetchFn) -> tuple[np.ndarray, np.ndarray]:
    """Dense hits restricted to the live ids `allowed` [n] (sorted, more than `search.filter_is_selective`
    allows: `dense_hits` scores a selective filter's matches exactly itself): an id selector where the index
    takes one, over-fetching where it does not (a GPU copy, binary IVF), then an exact search
    over the allowed vectors for any row still short of min(k, n): an approximate index (HNSW's
    graph, IVF's probed lists) can miss matches of a selective filter."""
    scores, ids = search.empty_hits(len(queries), k)
    if len(allowed) == 0:
        return scores, ids
    ntotal = derived.index.ntotal
    want = min(k, len(allowed))
    if derived.can_select:
        scores[:, :want], ids[:, :want] = search_index(queries, want, allowed)
    else:
        scores, ids = search.overfetch(search_index, queries, k, min(ntotal, 2 * k), ntotal,
                                       lambda found: np.isin(found, allowed))
    short = np.flatnonzero((ids >= 0).sum(axis=1) < want)
    if len(short):
        log.debug("%s: %d filtered queries searched exactly over %d items", derived.root, len(short), len(allowed))
        scores[short], ids[short] = search.exact_search(queries[short], allowed, k, derived.exact_fetch(allowed) or fetch)
    return scores, ids


def lexical_hits(store: MetaStore, root: Path, texts: list[str], k: int, where: SearchFilter | None,
                 syntax: bool) -> tuple[np.ndarray, np.ndarray]:
    """BM25 top-k of each query text: (scores [q, k], ids [q, k]), -inf / -1 padded."""
    if not store.has_lexical_index():
        raise CollectionError(f"{root}: the collection predates lexical search; open it for writing once "
                              f"to build its lexical index (faste-mm rebuild-index)")
    scores, ids = search.empty_hits(len(texts), k)
    for row, text in enumerate(texts):
        search.check_query_text(text, nul=syntax)  # plain words: a NUL separates words like a space
        match = text if syntax else search.fts_query(text)
        if not match.strip():
            continue
        hits = store.lexical_search(match, k, where)
        if hits:
            ids[row, :len(hits)], scores[row, :len(hits)] = zip(*hits)
    return scores, ids


def fused_hits(mode: str, k: int, dense: Callable[[], tuple[np.ndarray, np.ndarray]],
               lexical: Callable[[], tuple[np.ndarray, np.ndarray]], min_score: float | None = None,
               cosines: Callable[[np.ndarray], np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The hits of `mode` ("dense", "lexical" or "hybrid": reciprocal-rank fusion of both lists):
    (scores [q, k], ids [q, k], sources [q, k], which side found each hit). `min_score`: hits whose
    cosine with the query is below it are dropped before fusing: the dense side's by their scores,
    in hybrid mode the lexical side's too, by `cosines(ids [q, n]) -> [q, n]` (BM25 has no such
    scale; the lexical mode takes no min_score)."""
    lists = []
    if mode != "lexical":
        scores, ids = dense()
        if min_score is not None:
            weak = scores < min_score  # best first: the weak ones are a row's tail, padding stays last
            scores, ids = np.where(weak, -np.inf, scores).astype(np.float32), np.where(weak, -1, ids)
        lists.append((scores, ids))
    if mode != "dense":
        scores, ids = lexical()
        if mode == "hybrid" and min_score is not None and cosines is not None:
            ids = _kept_in_order(ids, (ids >= 0) & (cosines(ids) >= min_score))  # ranks among those kept
        lists.append((scores, ids))
    if mode == "hybrid":
        return search.fuse_rrf([lists[0][1], lists[1][1]], k)
    scores, ids = lists[0]
    side = search.FOUND_DENSE if mode == "dense" else search.FOUND_LEXICAL
    return scores, ids, np.where(ids >= 0, side, 0)


def _kept_in_order(ids: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """Each row of `ids` [q, n] with only its `keep` entries, in their order, padded with -1."""
    out = np.full_like(ids, -1)
    for row in range(len(ids)):
        kept = ids[row][keep[row]]
        out[row, :len(kept)] = kept
    return out

"""Scoring only the rows of an index that an id selector admits, each of them: a selective filter's
matches searched by the index's own codes without walking a graph or probing a subset of IVF lists,
which could miss some (`DerivedIndex.search_matches` builds the selector, a bitmap over the rows).
Receives the IndexIDMap2-wrapped index; hands back FAISS's (distances, rows of the inner index).
"""

from __future__ import annotations

from dataclasses import dataclass

import faiss
import numpy as np

from faste_mm.indexers.faiss_index import flat_rows, is_binary
from faste_mm.indexers.quantization import encode_binary


@dataclass(frozen=True, slots=True, eq=False)
class MatchScan:
    """How to score every row a selector admits, and only those, in an index wrapped by IndexIDMap2
    (`match_scan`): `core` searched exhaustively with the selector over its rows (flat codes), or,
    for an IVF `core`, every list probed with its centroid's score given (`centroids` [nlist, d],
    needed where codes are residuals of their list's centroid), skipping the coarse quantizer."""

    core: faiss.Index
    centroids: np.ndarray | None = None  # IVF only

    def search(self, queries: np.ndarray, k: int, selector: faiss.IDSelector) -> tuple[np.ndarray, np.ndarray]:
        """(FAISS's distances, rows of `core`) [q, k] over the rows `selector` admits."""
        if is_binary(self.core):
            params = faiss.SearchParameters()
            params.sel = selector
            return self.core.search(encode_binary(queries), k, params=params)
        x = np.ascontiguousarray(queries, dtype=np.float32)
        if self.centroids is None:
            params = faiss.SearchParameters()
            params.sel = selector
            return self.core.search(x, k, params=params)
        nlist = self.core.nlist
        lists = np.ascontiguousarray(np.broadcast_to(np.arange(nlist, dtype=np.int64), (len(x), nlist)))
        # Inner product: a residual code scores <q, centroid> + <q, residual>; flat lists ignore it.
        coarse = x @ self.centroids.T if self.core.by_residual else np.zeros((len(x), nlist), np.float32)
        coarse = np.ascontiguousarray(coarse, dtype=np.float32)
        params = faiss.SearchParametersIVF(nprobe=nlist, max_codes=0)
        params.sel = selector
        D, I = np.empty((len(x), k), np.float32), np.empty((len(x), k), np.int64)
        # The C++ call: FAISS's Python wrapper of search_preassigned refuses per-call parameters.
        self.core.search_preassigned_c(len(x), faiss.swig_ptr(x), k, faiss.swig_ptr(lists), faiss.swig_ptr(coarse),
                                       faiss.swig_ptr(D), faiss.swig_ptr(I), False, params)
        return D, I


def match_scan(index) -> MatchScan | None:
    """A `MatchScan` of an IndexIDMap2-wrapped index whose codes can all be scored under an id
    selector over its rows: Flat, SQ8/SQfp16 and BFlat (scanned), the flat storage under an HNSW
    graph (scanned, the graph unused), IVF Flat and IVF SQ (every list); None for any other kind
    (PQ and OPQ codes, binary IVF, a bare index)."""
    if not isinstance(index, (faiss.IndexIDMap2, faiss.IndexBinaryIDMap2)):
        return None
    if is_binary(index):
        core = faiss.downcast_IndexBinary(index.index)
        if isinstance(core, faiss.IndexBinaryHNSW):
            core = faiss.downcast_IndexBinary(core.storage)
        return MatchScan(core) if isinstance(core, faiss.IndexBinaryFlat) else None
    core = faiss.downcast_index(index.index)
    if isinstance(core, faiss.IndexHNSW):
        core = faiss.downcast_index(core.storage)
    if isinstance(core, (faiss.IndexFlat, faiss.IndexScalarQuantizer)):
        return MatchScan(core) if core.metric_type == faiss.METRIC_INNER_PRODUCT else None
    if isinstance(core, (faiss.IndexIVFFlat, faiss.IndexIVFScalarQuantizer)) and core.metric_type == faiss.METRIC_INNER_PRODUCT:
        quantizer = faiss.downcast_index(core.quantizer)
        flat = faiss.downcast_index(quantizer.storage) if isinstance(quantizer, faiss.IndexHNSW) else quantizer
        if isinstance(flat, faiss.IndexFlat):
            centroids = flat_rows(flat)  # a view of the quantizer's memory: fixed once trained
        else:
            centroids = quantizer.reconstruct_n(0, quantizer.ntotal)
        return MatchScan(core, centroids)
    return None

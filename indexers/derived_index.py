"""The FAISS index a collection derives from its vector parts: a cache, never the truth.

`DerivedIndex` owns index.faiss and its in-memory copy, keyed by (epoch, max part): the epoch
changes when `compact` rewrites the parts, and parts only grow between compactions, so an index
of the same epoch is caught up by adding the newer parts, and one of another epoch is rebuilt.
It receives the committed parts list [(part, rows)] and the manifest; it hands back the CPU index
(the one saved and added to) and a search copy (on a GPU when one is in use).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

import faiss
import numpy as np

from faste_mm.indexers import faiss_index, match_scan, parts
from faste_mm.indexers.manifest import Manifest
from faste_mm.indexers.quantization import Codec, encode_binary, hamming_to_score

log = logging.getLogger(__name__)

Parts = list[tuple[int, int]]  # committed (part number, rows), ascending


def max_part(committed: Parts) -> int:
    return max((p for p, _ in committed), default=-1)


def desired_factory(manifest: Manifest, committed: Parts) -> str:
    """The factory string the collection's index type resolves to at its current size."""
    n = sum(n for _, n in committed)
    return faiss_index.resolve_factory(manifest.index_type, n, manifest.dim, manifest.memory_budget_bytes,
                                       manifest.vectors)


class DerivedIndex:
    """index.faiss of the collection at `root`, in memory once used (see the module docstring)."""

    def __init__(self, root: Path, dim: int) -> None:
        self.root = root
        self.dim = dim
        self.index: faiss.IndexIDMap2 | None = None
        self.key: tuple[int, int] = (-1, -1)  # (epoch, max part) the index reflects
        self.factory: str | None = None
        self._search_copy: faiss.Index | None = None
        self._params: dict[tuple, faiss.SearchParameters | None] = {}  # per (k, nprobe, ef_search)
        self._can_select = False  # (`can_select`) set with `_search_copy`
        # (ids sorted, their rows in the index, the id of each row): kept per index state
        self._positions: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._matcher: match_scan.MatchScan | None | bool = False  # (`search_matches`) False: not yet asked

    @property
    def path(self) -> Path:
        return self.root / faiss_index.INDEX_NAME

    def current(self, epoch: int, committed: Parts, saved: Manifest | Callable[[], Manifest], manifest: Manifest) -> faiss.IndexIDMap2:
        """The index covering every committed part: kept in memory, loaded from index.faiss
        (`saved`: the manifest on disk, which says what the file covers, or a function reading it only
        when the index in memory is behind), caught up with the parts written since, or rebuilt when index.faiss
        is stale or missing."""
        if self.index is not None and self.key == (epoch, max_part(committed)):
            return self.index
        if self.index is None or self.key[0] != epoch:
            self._load_saved(epoch, committed, saved() if callable(saved) else saved)
        if self.index is not None and self.key[0] == epoch:
            behind = [(p, n) for p, n in committed if p > self.key[1]]
            codec = manifest.codec
            for part, n in behind:
                faiss_index.add_vectors(self.index, *parts.read_part(self.root, part, n, codec.width), codec)
            if behind:
                log.info("%s: added %d parts written since index.faiss was saved", self.root, len(behind))
        else:
            self.build(epoch, committed, desired_factory(manifest, committed), manifest)
        self.key = (epoch, max_part(committed))
        self._changed()
        return self.index

    def append(self, epoch: int, part: int, older_max_part: int, load: Callable[[], np.ndarray], ids: np.ndarray,
               codec: Codec | None = None) -> None:
        """A part just committed: add its codes (`load()`, [n, width] as `codec` stores them) when the
        index in memory covers everything before it (otherwise the next `current` catches up);
        codec None: float vectors."""
        if self.index is not None and self.key == (epoch, older_max_part):
            faiss_index.add_vectors(self.index, load(), ids, codec)
            self.key = (epoch, part)
            self._changed()

    def _changed(self) -> None:
        """Forget what was derived from the index object (it was replaced or grew)."""
        self._search_copy, self._params, self._positions, self._matcher = None, {}, None, False

    def build(self, epoch: int, committed: Parts, factory: str, manifest: Manifest) -> None:
        """Build `factory` over every committed part of `epoch`, keyed by them (the manifest's index
        type only words the warning when a trained index must wait for more vectors)."""
        codec = manifest.codec
        loaded = [parts.read_part(self.root, p, n, codec.width) for p, n in committed]
        n = sum(n for _, n in committed)
        requested = manifest.index_type
        if requested not in ("auto", factory):  # here, not in resolve_factory: once per build
            log.warning("%s: index %r needs at least %d vectors to train, the collection has %d; "
                        "searching with an exact %s index until it grows", self.root, requested,
                        faiss_index.min_training_vectors(requested), n, factory)
        log.info("%s: building %s over %d vectors", self.root, factory, n)
        self.index = faiss_index.build_index(factory, self.dim, loaded, manifest.memory_budget_bytes, codec=codec)
        self.factory = factory
        self.key = (epoch, max_part(committed))
        self._changed()

    def search(self, queries: np.ndarray, k: int, nprobe: int | None, ef_search: int | None,
               allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """FAISS search of the current index (call `current` first) for float queries [q, d]:
        (scores [q, k] float32, -inf where no hit; ids [q, k], -1 there). A binary index searches
        the queries' sign bits and scores by 1 - 2 * Hamming / d (`quantization.hamming_to_score`).

        allowed: item ids [n] int64 the hits must come from (needs `can_select`): FAISS skips
        every other id while it searches, so an approximate index still fills k slots from them
        when it reaches them (see `Collection.search` for the rows it does not fill)."""
        if allowed is None:  # the same few objects every call: made once per index state
            params = self._params.get((k, nprobe, ef_search), False)
            if params is False:
                params = self._params[(k, nprobe, ef_search)] = \
                    faiss_index.search_parameters(self.index, k, nprobe, ef_search) if self.can_select else None
        else:
            on_gpu = not self.can_select  # a fresh object: the selector must not stay on one shared by later searches
            assert not on_gpu, "GPU indexes take no id selector; the caller over-fetches instead"
            params = faiss_index.search_parameters(self.index, k, nprobe, ef_search) or faiss.SearchParameters()
            selector = faiss.IDSelectorBatch(np.ascontiguousarray(allowed, dtype=np.int64))
            params.sel = selector  # `selector` stays referenced until the search returns
        if faiss_index.is_binary(self.index):
            D, I = self._search_copy.search(encode_binary(queries), k, params=params)
            D = hamming_to_score(D, self.dim)
        else:
            D, I = self._search_copy.search(np.ascontiguousarray(queries), k, params=params)
        if I.min(initial=0) < 0:  # FAISS pads with -1 and its own sentinel distance
            D = np.where(I >= 0, D, -np.inf)
        return D.astype(np.float32, copy=False), I

    def exact_fetch(self, ids: np.ndarray) -> Callable[[np.ndarray], np.ndarray] | None:
        """A reader of stored vectors (some of `ids` [n], sorted -> float32 [m, d]) from the index's own
        storage in RAM, when it keeps them exactly as stored (Flat, HNSW over flat storage: the decoded
        parts it was built from, so the numbers a read from the parts gives) and holds every one of
        `ids`; else None (codes coarser than the parts, a GPU copy). Scoring a selective filter's few
        matches this way skips reading them from disk (1,000 rows of 2048 dims: ~8 ms, float16 parts)."""
        flat = faiss_index.flat_storage(self.index) if self.can_select else None
        rows = self._rows_of(ids) if flat is not None and len(ids) else None
        if rows is None:
            return None
        vectors = faiss_index.flat_rows(flat)
        return lambda chunk: vectors[rows[np.searchsorted(ids, chunk)]]

    def search_matches(self, queries: np.ndarray, allowed: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The best k of `allowed` [n] (sorted ids the index holds) for each query by the index's own
        codes, every one of them scored: (scores, ids) [q, k] as `search` gives. An exhaustive scan of
        the codes (SQ8, SQfp16, BFlat, or an HNSW graph's storage: its graph is not walked) or of every
        IVF list (the coarse quantizer skipped: each list is given with its centroid's score), FAISS
        skipping all other rows by one bit test each, a bitmap over the index's rows: no distance is
        computed for them, so a 1% filter costs about 1% of a scan plus the bit tests (at 1M x 512:
        BFlat ~2 ms, IVF4096 Flat ~4 ms, where reading the 10,000 matches from the parts took ~35 ms).
        An IVF Flat index scores exactly as the parts do (its lists hold the decoded parts), so its
        result is the exact top k over the matches; quantized codes need the caller's rescoring.
        None where the index cannot (a GPU copy, a pre-transform (OPQ), PQ codes, binary IVF or HNSW
        graph codes other than these, ids it does not hold)."""
        if not self.can_select or len(allowed) == 0:
            return None
        if self._matcher is False:
            self._matcher = match_scan.match_scan(self.index)
        matcher = self._matcher
        rows = self._rows_of(allowed) if matcher is not None else None
        if rows is None:
            return None
        n = matcher.core.ntotal
        marked = np.zeros(n, dtype=bool)
        marked[rows] = True
        bitmap = np.packbits(marked, bitorder="little")  # FAISS reads bit i of byte i // 8, low bit first
        selector = faiss.IDSelectorBitmap(n, faiss.swig_ptr(bitmap))  # `bitmap` outlives the search
        D, I = matcher.search(queries, min(k, n), selector)
        if faiss_index.is_binary(self.index):
            D = hamming_to_score(D, self.dim)
        ids = np.where(I >= 0, self._id_map()[np.maximum(I, 0)], -1)
        scores = np.where(I >= 0, D, -np.inf).astype(np.float32)
        if scores.shape[1] < k:
            padded_s, padded_i = np.full((len(queries), k), -np.inf, np.float32), np.full((len(queries), k), -1, np.int64)
            padded_s[:, :scores.shape[1]], padded_i[:, :ids.shape[1]] = scores, ids
            scores, ids = padded_s, padded_i
        return scores, ids

    def _id_map(self) -> np.ndarray:
        """The id of each row of the index (IndexIDMap2's id_map as an array; kept per index state)."""
        if self._positions is None:
            held = faiss.vector_to_array(self.index.id_map)
            if np.all(held[1:] > held[:-1]):  # filled in id order, as parts are: no sort of 1M ids
                self._positions = (held, np.arange(len(held)), held)
            else:
                order = np.argsort(held, kind="stable")
                self._positions = (held[order], order, held)
        return self._positions[2]

    def _rows_of(self, ids: np.ndarray) -> np.ndarray | None:
        """The rows of the index holding `ids` [n] (sorted), or None unless it holds every one."""
        self._id_map()
        held, order, _ = self._positions
        at = np.minimum(np.searchsorted(held, ids), max(len(held) - 1, 0))
        if len(held) == 0 or not np.array_equal(held[at], ids):
            return None
        return order[at]

    @property
    def can_select(self) -> bool:
        """Whether searches can take an id selector: FAISS's GPU indexes and its binary IVF ignore
        selectors, so they cannot (the collection filters by over-fetching there)."""
        if self._search_copy is None:
            self._search_copy = faiss_index.to_search_device(self.index)
            binary_ivf = faiss_index.is_binary(self.index) and faiss_index.is_binary_factory(self.factory or "") \
                and "IVF" in (self.factory or "")
            self._can_select = self._search_copy is self.index and not binary_ivf
        return self._can_select

    def save(self) -> str:
        """Write index.faiss (atomically); returns its sha256. The caller records it, `factory`
        and `key` in the manifest."""
        return faiss_index.save_index(self.index, self.path)

    def _load_saved(self, epoch: int, committed: Parts, saved: Manifest) -> None:
        """Adopt index.faiss if the manifest says it was built in this epoch, the file's sha256 is
        the one recorded with it, and its ids are exactly those of the parts it claims to cover,
        in order (a torn, edited or foreign file, or one saved for another epoch, fails these
        checks and is rebuilt)."""
        self.index = None
        if saved.index_epoch != epoch or saved.index_factory is None:
            return
        if saved.index_sha256 is not None and faiss_index.file_sha256(self.path) != saved.index_sha256:
            log.info("%s: index.faiss does not match the checksum in the manifest; rebuilding it", self.root)
            return
        index = faiss_index.load_index(self.path, faiss_index.is_binary_factory(saved.index_factory))
        covered = [(p, n) for p, n in committed if p <= saved.index_max_part]
        if index is None or index.d != self.dim \
                or not isinstance(index, (faiss.IndexIDMap2, faiss.IndexBinaryIDMap2)) \
                or not np.array_equal(faiss.vector_to_array(index.id_map), self._ids(covered)):
            log.info("%s: index.faiss is stale or missing; rebuilding it from the vectors", self.root)
            return
        self.index, self.factory = index, saved.index_factory
        self.key = (epoch, saved.index_max_part)

    def _ids(self, committed: Parts) -> np.ndarray:
        """The ids an index over `committed` holds, in the order it was filled."""
        ids = [parts.read_ids(self.root, p, n) for p, n in committed]
        return np.concatenate(ids) if ids else np.empty(0, dtype=np.int64)

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

from faste_mm.indexers import faiss_index, parts
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
        self._positions: tuple[np.ndarray, np.ndarray] | None = None  # (ids sorted, their rows in the index)

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
        self._search_copy, self._params, self._positions = None, {}, None

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
        on_gpu = not self.can_select
        if on_gpu:
            params = None
        elif allowed is None:  # the same few objects every call: made once per index state
            key = (k, nprobe, ef_search)
            if key not in self._params:
                self._params[key] = faiss_index.search_parameters(self.index, k, nprobe, ef_search)
            params = self._params[key]
        else:  # a fresh object: the selector must not stay on one shared by later searches
            assert not on_gpu, "GPU indexes take no id selector; the caller over-fetches instead"
            params = faiss_index.search_parameters(self.index, k, nprobe, ef_search) or faiss.SearchParameters()
            selector = faiss.IDSelectorBatch(np.ascontiguousarray(allowed, dtype=np.int64))
            params.sel = selector  # `selector` stays referenced until the search returns
        if faiss_index.is_binary(self.index):
            D, I = self._search_copy.search(encode_binary(queries), k, params=params)
            D = hamming_to_score(D, self.dim)
        else:
            D, I = self._search_copy.search(np.ascontiguousarray(queries), k, params=params)
        return np.where(I >= 0, D, -np.inf).astype(np.float32), I

    def exact_fetch(self, ids: np.ndarray) -> Callable[[np.ndarray], np.ndarray] | None:
        """A reader of stored vectors (some of `ids` [n], sorted -> float32 [m, d]) from the index's own
        storage in RAM, when it keeps them exactly as stored (Flat, HNSW over flat storage: the decoded
        parts it was built from, so the numbers a read from the parts gives) and holds every one of
        `ids`; else None (codes coarser than the parts, a GPU copy). Scoring a selective filter's few
        matches this way skips reading them from disk (1,000 rows of 2048 dims: ~8 ms, float16 parts)."""
        flat = faiss_index.flat_storage(self.index) if self.can_select else None
        if flat is None or len(ids) == 0:
            return None
        if self._positions is None:
            held = faiss.vector_to_array(self.index.id_map)
            if np.all(held[1:] > held[:-1]):  # filled in id order, as parts are: no sort of 1M ids
                self._positions = (held, np.arange(len(held)))
            else:
                order = np.argsort(held, kind="stable")
                self._positions = (held[order], order)
        held, order = self._positions
        at = np.minimum(np.searchsorted(held, ids), max(len(held) - 1, 0))
        if len(held) == 0 or not np.array_equal(held[at], ids):
            return None
        rows, vectors = order[at], faiss_index.flat_rows(flat)
        return lambda chunk: vectors[rows[np.searchsorted(ids, chunk)]]

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

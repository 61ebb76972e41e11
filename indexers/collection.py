"""Collection: one directory of vector parts + meta.sqlite (the truth) + index.faiss (derived).

Receives float32 vectors [n, d] with one `ItemRecord` each (no model code here); hands back
item ids, search results (scores, ids) and records. The class keeps the open state and the
writes; it composes `opening` (create/open checks), `store` (SQLite, all SQL), `parts` and
`stored_vectors` (vector files), `derived_index` (index.faiss, a cache of the parts),
`collection_search` (the read path of one snapshot), `scan_plan`, `compaction`, `manifest` and
`directory` (which files are ours, the one-writer flock, erase).
"""
# Size: ~590 lines, over the ~450 of issue 22: the work lives in the stage modules named above; what stays is
# the public surface (about 30 short methods whose docstrings are the collection's API reference; a read one
# caller alone needs is a function of the rows beside it, through `read`) and the writer's open state they
# share. Splitting the surface itself would spread one object's contract over files.

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence, TypeVar

import numpy as np

from faste_mm.errors import CollectionError, ConfigError, InputError
from faste_mm.indexers import (collection_search, directory, faiss_index, index_upkeep, opening, parts,
                               quantization, search)
from faste_mm.indexers import file_identity
from faste_mm.indexers.albums import AlbumStore, mark_changed
from faste_mm.indexers.compaction import compact_parts
from faste_mm.indexers.crash_points import crash_point
from faste_mm.indexers.derived_index import DerivedIndex, max_part
from faste_mm.indexers import fact_rows
from faste_mm.indexers.facts import ItemFacts
from faste_mm.indexers.filters import SearchFilter
from faste_mm.indexers.manifest import Manifest, read_manifest, write_manifest
from faste_mm.indexers.records import CollectionInfo, FileStat, ItemRecord, ScanPlan, Status, check_rows
from faste_mm.indexers.scan_plan import plan_scan
from faste_mm.indexers.store import MetaStore
from faste_mm.indexers.schema import fill_meta_index
from faste_mm.indexers.stored_vectors import MappedParts, iter_live
from faste_mm.indexers.writes import check_failures, store_chunk

log = logging.getLogger(__name__)
T = TypeVar("T")

class Collection:
    """A searchable store of embedding vectors and their item records.

    Use `Collection.create(path, manifest)` or `Collection.open(path, writable=...)`, as a
    context manager. Not thread-safe: use one instance per thread.

    Example:
        with Collection.create("photos.fmm", Manifest(model_id="Qwen/Qwen3-VL-Embedding-2B",
                                                      dim=2048)) as col:
            ids = col.add(vectors, [ItemRecord(uri="/p/a.jpg", modality="image")])
            scores, found = col.search(queries, k=10)
    """

    def __init__(self, root: Path, manifest: Manifest, store: MetaStore,
                 lock_fd: int | None) -> None:
        self.root = root
        self._manifest = manifest
        self._store = store
        self._lock_fd = lock_fd
        self._index = DerivedIndex(root, manifest.dim)
        self._parts = MappedParts(root)
        self._closed = False
        self._generation = directory.HeldGeneration(root)
        self._expect: Manifest | None = None  # a reader's `open(expect=...)`, checked again on reload
        self._current_for: tuple | None = None  # (store, version, index) `_current_index` last checked
        # the last unfiltered snapshot that found its index current and no tombstoned vector in it
        self._plain_at: collection_search.PlainSnapshot | None = None

    # ---- lifecycle -------------------------------------------------------------------------
    @classmethod
    def create(cls, path: str | os.PathLike, manifest: Manifest, exist_ok: bool = False) -> "Collection":
        """Create a collection directory and open it for writing.

        exist_ok: open an existing collection instead, after checking that its settings match
        `manifest` (CollectionError listing every difference otherwise).
        Raises CollectionError if `path` exists and is not a collection (or exist_ok is False).
        """
        root = Path(path)
        if opening.is_existing(root, manifest, exist_ok):
            return cls.open(root, writable=True, expect=manifest)
        made = opening.create_files(root, manifest)
        if made is None:  # another process completed a create meanwhile
            return cls.create(root, manifest, exist_ok=exist_ok)
        manifest, store, lock_fd = made
        log.info("created collection %s (%s, dim %d)", root, manifest.model_id, manifest.dim)
        return cls(root, manifest, store, lock_fd)

    @classmethod
    def open(cls, path: str | os.PathLike, writable: bool = False,
             expect: Manifest | None = None) -> "Collection":
        """Open an existing collection.

        writable: take the writer lock (CollectionError at once if another process holds it),
            migrate an older schema, and remove orphaned part files left by a crash.
        expect: settings of the caller (model, dim, instruction, ...); any difference that makes
            vectors incomparable raises CollectionError naming each field.
        """
        root = Path(path)
        manifest, store, lock_fd = opening.open_files(root, writable, expect)
        col = cls(root, manifest, store, lock_fd)
        col._expect = expect
        return col

    @classmethod
    def erase(cls, path: str | os.PathLike, *, for_create: bool = False) -> bool:
        """Delete a collection (database, vectors, index, manifest, lock) under the writer lock,
        then its directory if nothing else is left in it. Returns False, touching nothing, when
        `path` holds no collection.

        for_create: the caller creates a collection here next (`index --reindex`); refuse,
            touching nothing, when files that are not the collection's would make `create`
            refuse the directory afterwards.
        Raises CollectionError at once if another process writes to it, if its manifest is not
        a faste-mm manifest (a folder that merely has a manifest.json is never emptied), or (see
        for_create) if it holds foreign files.
        """
        return directory.erase(Path(path), for_create=for_create)

    @property
    def writable(self) -> bool:
        return self._lock_fd is not None

    @property
    def manifest(self) -> Manifest:
        return self._manifest

    def close(self) -> None:
        """Bring index.faiss up to date (writers), then release the database and the lock."""
        if self._closed:
            return
        try:
            if self.writable:
                self._finalize()
        finally:
            self._closed = True
            self._store.close()
            self._generation.close()
            if self._lock_fd is not None:
                os.close(self._lock_fd)  # closing the fd releases the flock
                self._lock_fd = None

    def __enter__(self) -> "Collection":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _follow_reindex(self) -> None:
        """A reader whose collection was erased and created again since it opened (`index
        --reindex`: a new generation token) switches to the new one, so it never returns items
        that are gone or ids that now name other files. CollectionError when the collection is
        gone. Writers hold the lock, so no erase can happen under them."""
        if self.writable or self._closed or self._store.db.in_transaction:  # mid-search: the next call
            return
        if self._generation.is_current():
            return
        if directory.read_generation(self.root) == self._generation.token:  # the same token, rewritten
            self._generation.close()
            self._generation = directory.HeldGeneration(self.root)
            return
        fresh = Collection.open(self.root, expect=self._expect)
        self._store.close()
        self._generation.close()
        self._manifest, self._store, self._index = fresh._manifest, fresh._store, fresh._index
        self._generation = fresh._generation
        self._parts.clear()  # the new collection numbers its parts from 0 again
        log.info("%s: the collection was re-created; reading the new one", self.root)

    def _saved_manifest(self) -> Manifest:
        """manifest.json as on disk. A writer holds it already (every change goes through it and
        no one else may write); a reader re-reads it, since a writer may have saved since."""
        return self._manifest if self.writable else read_manifest(self.root)

    def _require_writable(self, what: str) -> None:
        if self._closed:
            raise CollectionError(f"{self.root}: the collection is closed; reopen it to {what}")
        if not self.writable:
            raise CollectionError(f"{self.root}: opened read-only; open it with writable=True "
                                  f"to {what}")

    # ---- writing ---------------------------------------------------------------------------
    def add(self, vectors: np.ndarray, records: Sequence[ItemRecord]) -> np.ndarray:
        """Store `vectors` [n, dim] (float32, unit-norm when the manifest says normalized) with
        one record each, as one new part and one SQLite commit. Returns the new ids [n] int64.

        A live item with the same (uri, page), and failed rows of the same uri, are replaced.
        Raises InputError naming the record when shapes, values or (uri, page) pairs are bad.
        """
        self._require_writable("add items")
        return self.commit(vectors, records)[0]

    def add_failures(self, records: Sequence[ItemRecord]) -> np.ndarray:
        """Record items that could not be embedded (each with `error` set); they get ids but
        no vectors. A later successful `add` of the same uri replaces them. Returns ids."""
        self._require_writable("record failures")
        return self.commit(np.empty((0, self._manifest.dim), dtype=np.float32), [], records)[1]

    def commit(self, vectors: np.ndarray, records: Sequence[ItemRecord],
               failures: Sequence[ItemRecord] = (), replace_uris: Sequence[str] = (),
               settle: Sequence[FileStat] = ()) -> tuple[np.ndarray, np.ndarray]:
        """`delete(uris=replace_uris)`, `add(vectors, records)` and `add_failures(failures)` as
        ONE transaction, so a crash keeps all of a chunk of files or none of it (a file whose
        good pages were stored always has its failed pages recorded too). `settle`: files whose
        earlier rows were committed page range by page range without their mtime; all their
        rows get the file's size and mtime in the same transaction (the file is complete).
        Returns the ids of `records` and of `failures`. Raises InputError, storing nothing, as
        `add` and `add_failures` do."""
        self._require_writable("add items")
        vectors = check_rows(vectors, records, self._manifest.dim, self._manifest.normalized, self.root)
        check_failures(failures, self.root)
        n, n_failed = len(records), len(failures)
        if n + n_failed + len(replace_uris) + len(settle) == 0:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
        codes = self._encode(vectors) if n else vectors
        ids, part, epoch = store_chunk(self.root, self._store, codes, self._codec().dtype, records, failures,
                                       replace_uris, settle)
        if n and self._index.index is not None:  # keep an index in memory current (read back: the stored dtype)
            older = max_part([(p, size) for p, size in self._store.parts() if p < part])
            codec = self._codec()
            self._index.append(epoch, part, older, lambda: parts.read_part(self.root, part, n, codec.width)[0],
                               ids[:n], codec)
        log.debug("%s: added %d items as part %d and %d failures", self.root, n, part, n_failed)
        return ids[:n], ids[n:]

    def _encode(self, vectors: np.ndarray) -> np.ndarray:
        """Float vectors [n, d] -> the codes the parts store. The first vectors of a collection with
        8-bit codes calibrate its ranges, saved to the manifest before any code is written and fixed
        from then on (a crash before the rows commit keeps ranges that no code used yet: harmless)."""
        if self._manifest.uses_int8 and self._manifest.int8_ranges is None:
            self._manifest = self._manifest.replace(int8_ranges=quantization.calibrate_int8(vectors))
            write_manifest(self.root, self._manifest)
            log.info("%s: calibrated 8-bit ranges on the first %d vectors", self.root, len(vectors))
        return self._codec().encode(vectors)

    def _codec(self) -> quantization.Codec:
        """How the parts store vectors. A reader opened before the first add of a collection with
        8-bit codes learns the ranges the writer calibrated since."""
        if self._manifest.uses_int8 and self._manifest.int8_ranges is None and not self.writable:
            self._manifest = self._manifest.replace(int8_ranges=read_manifest(self.root).int8_ranges)
        return self._manifest.codec

    def delete(self, ids: Iterable[int] = (), *, uris: Iterable[str] = ()) -> int:
        """Tombstone items by id, and every item (all pages) of each of `uris` with its failure rows
        dropped, in one transaction; their vectors stay until `compact`. Returns how many items
        changed; unknown or already deleted ids and uris are ignored, so a repeated call is harmless."""
        self._require_writable("delete items")
        ids, uris = [int(i) for i in ids], list(uris)
        with self._store.transaction():
            changed = (self._store.tombstone_ids(ids) if ids else 0) + (self._store.tombstone_uris(uris) if uris else 0)
        crash_point("delete-after-commit")
        return changed

    def fill_identities(self, stats: Iterable[FileStat]) -> None:
        """Record the identity (dev, ino) of indexed files that have none yet (indexed before
        identities were recorded); a file's recorded identity is kept."""
        self._require_writable("record file identities")
        rows = [(s.uri, s.dev, s.ino) for s in stats if s.ino is not None]
        if rows:
            with self._store.transaction():
                file_identity.set_identities(self._store.db, rows, keep=True)

    def exclude(self, uris: Iterable[str]) -> None:
        """Record removed paths (files or folders, as stored uris) that scans of a folder above
        them must skip from now on (`exclusions`); recording one twice is harmless."""
        self._require_writable("record exclusions")
        with self._store.transaction():
            self._store.add_exclusions(sorted(set(uris)))

    def include_again(self, uris: Iterable[str]) -> list[str]:
        """Drop the exclusions of exactly these uris (the user named them on `index` again);
        returns the ones that were excluded."""
        self._require_writable("clear exclusions")
        wanted = set(uris)
        cleared = [u for u in self.exclusions() if u in wanted]
        if cleared:
            with self._store.transaction():
                self._store.remove_exclusions(cleared)
        return cleared

    def exclusions(self) -> list[str]:
        """Removed paths that scans of their parent folders skip, sorted."""
        return [uri for uri, _ in self._store.exclusions()]

    # ---- reading ---------------------------------------------------------------------------
    def get(self, ids: Iterable[int]) -> list[ItemRecord]:
        """Records for `ids`, in the same order. CollectionError names any unknown id."""
        self._follow_reindex()
        ids = [int(i) for i in ids]
        found = self._store.records(ids)
        missing = [i for i in ids if i not in found]
        if missing:
            raise CollectionError(f"{self.root}: no item with id {missing[:10]}"
                                  f"{' ...' if len(missing) > 10 else ''}")
        return [found[i] for i in ids]

    def records(self, ids: Iterable[int]) -> dict[int, ItemRecord]:
        """{id: record} of those `ids` that have a row (any status); unknown ids are left out."""
        self._follow_reindex()
        return self._store.records([int(i) for i in ids])

    def vectors(self, ids: Iterable[int]) -> np.ndarray:
        """Stored vectors [n, dim] float32 for item ids (e.g. to copy a duplicate's vector
        instead of re-embedding it; decoded from 8-bit or binary codes when the parts keep those).
        CollectionError names ids without a stored vector."""
        self._follow_reindex()
        wanted = ids if isinstance(ids, np.ndarray) else np.fromiter(ids, dtype=np.int64)
        return self._parts.vectors(self._store, wanted, self._codec(), self._manifest.dim)

    def iter_live(self, chunk_rows: int = 4096) -> Iterator[tuple[list[ItemRecord], np.ndarray]]:
        """Every live item with its vector, in storage order, `chunk_rows` at a time: (records,
        vectors [n, dim] float32). Memory stays bounded by one chunk whatever the collection's
        size (parts are memory-mapped), for exporting a collection to other stores."""
        return iter_live(self.root, self._store, self._codec(), chunk_rows)

    def live_ids(self, ids: Iterable[int]) -> set[int]:
        """The subset of `ids` that are live (searchable) items."""
        self._follow_reindex()
        return self._store.live_ids([int(i) for i in ids])

    def read(self, query: Callable[[MetaStore], T]) -> T:
        """`query(rows)` over the collection's rows (its `indexers.store.MetaStore`), after following
        a re-index as every read here does. What one caller alone asks of the rows lives beside it as
        a function of them (`ocr_rows.items_without_body`, `MetaStore.places`, ...), not as a method
        here. `query` only reads: every change goes through this class's writing methods."""
        self._follow_reindex()
        return query(self._store)

    def newest(self, k: int, where: SearchFilter | None = None) -> search.Found:
        """The k newest live items meeting `where` (by date taken; undated last), as one query row
        of `Found` (scores 0: nothing ranks them; found by "filters"): a search of filters only
        lists what matches."""
        self._check_search(None, k)

        def run() -> tuple[np.ndarray, np.ndarray]:
            ids = np.full((1, k), -1, dtype=np.int64)
            found = self._store.newest_ids(where or SearchFilter(), k)
            ids[0, :len(found)] = found
            return np.zeros((1, k), dtype=np.float32), ids

        scores, ids, records = collection_search.in_snapshot(self._store, self.root, run, retry=not self.writable)
        return search.Found(scores, ids, np.where(ids >= 0, search.FOUND_FILTERS, 0), records)

    def plan_scan(self, files: Iterable[FileStat], under: str | None = None,
                  retry_failed: bool = False) -> ScanPlan:
        """Split scanned files by (uri, size, mtime) against the live items.

        under: only uris equal to this prefix or below it (a path + "/") can be reported
            vanished, so scanning one folder never tombstones items of another.
        retry_failed: report unchanged files that failed last time as changed.
        """
        return plan_scan(self._store.live_file_stats(), files, under, retry_failed)

    # ---- search ----------------------------------------------------------------------------
    def search(self, queries: np.ndarray, k: int, nprobe: int | None = None, ef_search: int | None = None,
               where: SearchFilter | None = None, rescore: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Top-k live items by inner product for each query.

        Args: queries [q, dim] float32; k >= 1; nprobe (IVF lists probed) and ef_search (HNSW
            candidate list) override the defaults in `faiss_index.search_parameters`;
            where: only items meeting this `SearchFilter` (metadata, kind, path glob);
            rescore: when the index holds coarser codes than the parts (int8, binary, PQ), fetch k x
            rescore candidates and rescore them exactly from the stored vectors (None: the
            precision's `search.DEFAULT_RESCORE`; 0: return the index's own scores).
        Returns: (scores [q, k] float32, ids [q, k] int64), best first; -1 / -inf pad rows with
            fewer than k live (matching) items. Tombstoned items are filtered out by over-fetching.
            A filtered search returns min(k, matching items) hits per query with every index
            kind: FAISS searches only the matching ids, and a row an approximate index leaves
            short is searched exactly over the matching vectors.
        """
        queries = self._check_search(queries, k)
        if where is None or where.is_empty:
            found = collection_search.unchanged_hits(self._plain_at, self._store, self._index, queries, k, nprobe,
                                                     ef_search, rescore)
            if found is not None:
                return found
        scores, ids, _ = collection_search.in_snapshot(
            self._store, self.root, lambda: self._search_snapshot(queries, k, nprobe, ef_search, where, rescore),
            retry=not self.writable, records=False)
        return scores, ids

    def find(self, k: int, *, queries: np.ndarray | None = None, texts: Sequence[str] | None = None,
             mode: str = "dense", where: SearchFilter | None = None, nprobe: int | None = None,
             ef_search: int | None = None, rescore: int | None = None, lexical_syntax: bool = False,
             min_score: float | None = None) -> search.Found:
        """Search by vectors (mode "dense": `search`'s hits with their records), by words (mode "lexical": BM25 over
        the items' text, file names, path words and metadata values; needs no vectors) or by both
        (mode "hybrid": reciprocal-rank fusion of the two lists, each `search.hybrid_depth(k)` deep; the
        dense list rescored only k x rescore rows deep, `collection_search.fusion_rescore`).

        queries: [q, dim] float32 (dense, hybrid); texts: q query strings (lexical, hybrid), searched
        as plain words unless `lexical_syntax` (FTS5 syntax: AND, OR, NOT, "phrases", prefix*; an
        invalid expression raises InputError); where filters both sides. Returns `search.Found`,
        whose `sources` say which side found each hit, and the records of the ids found, all read from
        one snapshot (`collection_search.in_snapshot`): a search running while a writer adds, deletes
        or compacts sees the rows and parts of one moment, never an item tombstoned before it.
        min_score: hits whose cosine with the query is below it are dropped: dense hits by their
        scores; in hybrid mode the lexical side's too, by their stored vectors' cosines, before fusing
        (the lexical mode has no query vector: it ignores it).
        """
        if mode not in search.MODES:
            raise ConfigError(f"search mode must be one of {search.MODES}, got {mode!r}")
        q = None
        if mode != "lexical":
            if queries is None:
                raise ConfigError(f"search mode {mode!r} needs query vectors")
            queries = self._check_search(queries, k)
            q = len(queries)
        if mode != "dense":
            if texts is None or isinstance(texts, str) or (q is not None and len(texts) != q):
                raise InputError(f"{self.root}: search mode {mode!r} needs one query text per query "
                                 f"({q if q is not None else 'a list'}), got {texts!r:.80}")
            self._check_search(None, k)
        depth = search.hybrid_depth(k) if mode == "hybrid" else k

        def dense_rescore() -> int | None:
            if mode != "hybrid":
                return rescore
            self._current_index()  # the factory of the index this snapshot searches
            return collection_search.fusion_rescore(rescore, k, depth, self._index.factory,
                                                    self._manifest.stored_precision)

        def cosines(ids: np.ndarray) -> np.ndarray:  # of hybrid's word matches, with their row's query
            out = np.full(ids.shape, -np.inf, dtype=np.float32)
            rows, cols = np.nonzero(ids >= 0)
            stored = self._parts.vectors(self._store, ids[rows, cols], self._codec(), self._manifest.dim)
            out[rows, cols] = np.einsum("ij,ij->i", stored, queries[rows])
            return out

        def run() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
            scores, ids, sources = collection_search.fused_hits(
                mode, k,
                lambda: self._search_snapshot(queries, depth, nprobe, ef_search, where, dense_rescore()),
                lambda: collection_search.lexical_hits(self._store, self.root, list(texts), depth, where,
                                                       lexical_syntax), min_score, cosines)
            return scores, ids, sources, cosines(ids) if mode == "hybrid" else None

        scores, ids, sources, similarities, records = collection_search.in_snapshot(self._store, self.root, run,
                                                                                    retry=not self.writable)
        return search.Found(scores, ids, sources, records, similarities)

    def _check_search(self, queries: np.ndarray | None, k: int) -> np.ndarray | None:
        if self._closed:
            raise CollectionError(f"{self.root}: the collection is closed; reopen it to search")
        self._follow_reindex()
        if not isinstance(k, int) or k < 1:
            raise ConfigError(f"search k must be an int >= 1, got {k!r}")
        if queries is None:
            return None
        queries = np.asarray(queries, dtype=np.float32)
        if queries.ndim != 2 or queries.shape[1] != self._manifest.dim:
            raise InputError(f"{self.root}: queries have shape {queries.shape}, expected "
                             f"[q, {self._manifest.dim}]")
        return queries

    def _search_snapshot(self, queries: np.ndarray, k: int, nprobe: int | None, ef_search: int | None,
                         where: SearchFilter | None, rescore: int | None) -> tuple[np.ndarray, np.ndarray]:
        index = self._current_index()
        found = collection_search.dense_hits(self._index, self._store, queries, k, nprobe, ef_search, where, rescore,
                                             self._manifest.stored_precision, self.vectors)
        if (where is None or where.is_empty) and self._store.n_tombstoned_vectors() == 0:
            self._plain_at = collection_search.PlainSnapshot(
                self._store, self._store.version(), index,
                collection_search.rescores(self._index.factory, self._manifest.stored_precision))
        return found

    # ---- text and facts (filled in after the rows: OCR, rebuild-index, a re-scan) --------------
    def set_facts(self, pairs: Sequence[tuple[ItemRecord, ItemFacts]]) -> None:
        """Give live items (records with their id, as read) these facts, and their lexical rows the
        facts' words, in one transaction; no vector is read or written."""
        self._require_writable("store item facts")
        with self._store.transaction():
            fact_rows.set_facts(self._store.db, pairs)
            mark_changed(self._store.db, [r.id for r, _ in pairs])

    def texts(self, ids: Iterable[int]) -> dict[int, str]:
        """The lexical text stored for these items ({id: text}; items without text are absent)."""
        return self._store.texts([int(i) for i in ids]) if self._store.has_lexical_index() else {}

    def set_texts(self, texts: Sequence[tuple[int, str]]) -> None:
        """Give live items their text in the lexical index: [(id, text)] (`rebuild-index` fills
        in the items of `MetaStore.items_without_text` from their files), in one transaction."""
        self._require_writable("index text")
        with self._store.transaction():
            self._store.set_texts(texts)
            mark_changed(self._store.db, [i for i, _ in texts])

    def rebuild_filter_index(self) -> None:
        """Refill the metadata index `where` filters read (`items_meta`, kept by triggers) from the
        rows: `rebuild-index` rebuilds every derived structure, this one included."""
        self._require_writable("rebuild the filter index")
        if self._store.has_meta_index():
            with self._store.transaction():
                fill_meta_index(self._store.db)

    # ---- index maintenance -----------------------------------------------------------------
    def _current_index(self):
        """The derived index, brought up to every committed part (see `DerivedIndex.current`)."""
        # Unchanged since the last call (same store, same file version, same index object): current already.
        version, last = self._store.version(), self._current_for
        if last is not None and last[0] is self._store and last[1] == version and last[2] is self._index.index:
            return self._index.index
        index = self._index.current(self._store.state()["epoch"], self._store.parts(), self._saved_manifest,
                                    self._manifest)
        self._current_for = (self._store, version, index)
        return index

    def update_settings(self, settings: Mapping[str, Any]) -> None:
        """Record new collection settings (`Manifest.settings`, as `CollectionProfile.to_manifest`
        makes them) that leave stored vectors comparable: FastE's threshold for new documents,
        OCR. The profile's owner decides what may change in place; the fields storage reads
        itself (model id, dim, precision) are not settings and never change here."""
        self._require_writable("change its settings")
        self._manifest = self._manifest.replace(settings=settings)
        write_manifest(self.root, self._manifest)

    def save_index(self) -> None:
        """Bring the index up to date and write index.faiss + manifest (after a long add run,
        so that a crash later costs no rebuild). Called by close()."""
        self._require_writable("save the index")
        self._current_index()
        self._manifest = index_upkeep.save(self.root, self._index, self._store, self._manifest)

    def rebuild_index(self, index_type: str | None = None) -> str:
        """Rebuild index.faiss from the stored vectors (no re-embedding); returns the factory.

        index_type: "auto" or a FAISS factory string to switch to (recorded in the manifest);
        None keeps the current choice. Raises ConfigError for an invalid factory string.
        """
        self._require_writable("rebuild the index")
        previous = self._manifest
        if index_type is not None:
            faiss_index.validate_factory(index_type, self._manifest.dim, self._manifest.vectors)
            self._manifest = self._manifest.replace(index_type=index_type)
        try:
            index_upkeep.rebuild(self._index, self._store, self._manifest)
        except BaseException:
            self._manifest = previous  # a failed switch is not recorded (close would retry it)
            raise
        self.save_index()
        return self._index.factory

    def _finalize(self) -> None:
        """At close: switch index kind if the collection outgrew it, save if anything changed."""
        action = index_upkeep.at_close(self.root, self._index, self._store, self._saved_manifest(), self._manifest)
        if action == "rebuild":
            self.rebuild_index()
        elif action == "save":
            self.save_index()
        elif action == "counts":
            self._manifest = self._manifest.replace(counts=self._store.counts())
            write_manifest(self.root, self._manifest)

    def compact(self) -> int:
        """Drop tombstoned vectors from the parts, merge small parts, and rebuild the index.

        New parts are written and renamed first, then one transaction repoints the items and
        deletes the tombstones, then old part files are unlinked: a crash at any point leaves
        either the old or the new layout (plus orphans swept on open). Returns vectors dropped.
        """
        self._require_writable("compact it")
        done = compact_parts(self.root, self._store, self._codec())
        if done is None:
            return 0
        n_dead, n_before, n_after = done
        self._parts.clear()  # frees the removed files' space
        log.info("%s: compacted %d parts into %d, dropped %d deleted vectors", self.root, n_before, n_after, n_dead)
        self.rebuild_index()
        return n_dead

    def albums(self) -> AlbumStore:
        """The collection's albums (saved searches, `indexers.albums`), in this database: read on any
        open collection, written only by its writer."""
        self._follow_reindex()
        return AlbumStore(self._store, self._require_writable)

    # ---- summary ---------------------------------------------------------------------------
    def info(self) -> CollectionInfo:
        """Counts, index kind and on-disk size (bytes, all files) of the collection."""
        self._follow_reindex()
        counts = self._store.counts()
        committed = self._store.parts()
        saved = self._saved_manifest()
        key = (self._store.state()["epoch"], max_part(committed))
        size = sum(p.stat().st_size for p in self.root.rglob("*") if p.is_file())
        return CollectionInfo(
            path=str(self.root), model_id=self._manifest.model_id, dim=self._manifest.dim,
            vector_dtype=self._manifest.vector_dtype, vectors=self._manifest.vectors, keep=self._manifest.keep,
            n_ok=counts[Status.OK],
            n_failed=counts[Status.FAILED], n_deleted=counts[Status.DELETED], n_parts=len(committed),
            index_type=self._manifest.index_type,
            index_factory=self._index.factory or saved.index_factory,
            index_is_current=(saved.index_epoch, saved.index_max_part) == key,
            size_bytes=size, failures=tuple(self._store.records_where_status(Status.FAILED)), exclusions=tuple(self.exclusions()),
            facts=fact_rows.summary(self._store.db) if self._store.has_facts() else {})

"""Collection: one directory of vector parts + meta.sqlite (the truth) + index.faiss (derived).

Receives float32 vectors [n, d] with one `ItemRecord` each (no model code here); hands back
item ids, search results (scores, ids) and records. Composes `store` (SQLite, all SQL), `parts`
(vector files), `derived_index` (index.faiss, a cache of the parts), `manifest` and `directory`
(which files are ours, the one-writer flock, erase).

Size (~830 lines, over the ~450 of issue 22): the search path's array work lives in
`indexers.search` and `indexers.quantization`, but its entry points (search, find, the snapshot
loop, rescoring and lexical reads) are still methods here beside the writes they must see
consistently; moving the reader side into its own class is the next split.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from faste_mm.errors import CollectionError, ConfigError, InputError
from faste_mm.indexers import directory, faiss_index, parts, quantization, search
from faste_mm.indexers.derived_index import DerivedIndex, desired_factory, max_part
from faste_mm.indexers.crash_points import crash_point
from faste_mm.indexers.directory import acquire_lock
from faste_mm.indexers.filters import SearchFilter
from faste_mm.indexers.manifest import (MANIFEST_NAME, Manifest, read_manifest, settings_mismatch,
                                        write_manifest)
from faste_mm.indexers.records import (CollectionInfo, FileStat, ItemRecord, ScanPlan, Status, check_rows,
                                       check_unique)
from faste_mm.indexers.store import MetaStore

log = logging.getLogger(__name__)

# compact() rewrites parts to at most this many rows (32 MiB at d=2048 float16).
COMPACT_PART_ROWS = 8192
# A reader retries this often when compacts keep replacing the parts under its snapshot.
_SNAPSHOT_ATTEMPTS = 5
# Part mappings `vectors` keeps open between calls (pruned to the committed parts past this many).
_MAPPED_PARTS = 256


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
        self._parts_mapped: dict[int, np.ndarray] = {}  # see _mapped_part
        self._closed = False
        self._generation = directory.read_generation(root)
        self._expect: Manifest | None = None  # a reader's `open(expect=...)`, checked again on reload

    # ---- lifecycle -------------------------------------------------------------------------
    @classmethod
    def create(cls, path: str | Path, manifest: Manifest, exist_ok: bool = False) -> "Collection":
        """Create a collection directory and open it for writing.

        exist_ok: open an existing collection instead, after checking that its settings match
        `manifest` (CollectionError listing every difference otherwise).
        Raises CollectionError if `path` exists and is not a collection (or exist_ok is False).
        """
        root = Path(path)
        faiss_index.validate_factory(manifest.index_type, manifest.dim, manifest.vectors)
        if (root / MANIFEST_NAME).exists():
            if not exist_ok:
                raise CollectionError(f"{root}: a collection already exists here; open it, or "
                                      f"pass exist_ok=True to add to it")
            return cls.open(root, writable=True, expect=manifest)
        if root.exists() and not root.is_dir():
            raise CollectionError(f"{root}: is a file, not a collection directory; choose a new path")
        if root.exists():
            # A directory left by an interrupted create or erase holds only our files (temp files
            # included); anything else means the user pointed us at the wrong folder, which we
            # must not litter.
            foreign = directory.foreign_files(root, after_erase=True)
            if foreign:
                raise CollectionError(f"{root}: directory is not empty and not a collection "
                                      f"(contains {foreign[:3]}); choose a new path")
        root.mkdir(parents=True, exist_ok=True)
        lock_fd = acquire_lock(root)
        try:
            if (root / MANIFEST_NAME).exists():  # another process completed a create meanwhile
                os.close(lock_fd)
                lock_fd = None
                return cls.create(root, manifest, exist_ok=exist_ok)
            directory.complete_interrupted_create(root)
            (root / parts.VECTORS_DIR).mkdir(exist_ok=True)
            store = MetaStore(root, writable=True, create=True)
            directory.write_generation(root)
            manifest = manifest.replace(index_factory=None, index_epoch=-1, index_max_part=-1,
                                        counts=store.counts())
            # Last: its presence marks a complete collection.
            write_manifest(root, manifest, crash_at="create-before-manifest")
        except BaseException:
            if lock_fd is not None:
                os.close(lock_fd)
            raise
        log.info("created collection %s (%s, dim %d)", root, manifest.model_id, manifest.dim)
        return cls(root, manifest, store, lock_fd)

    @classmethod
    def open(cls, path: str | Path, writable: bool = False,
             expect: Manifest | None = None) -> "Collection":
        """Open an existing collection.

        writable: take the writer lock (CollectionError at once if another process holds it),
            migrate an older schema, and remove orphaned part files left by a crash.
        expect: settings of the caller (model, dim, instruction, ...); any difference that makes
            vectors incomparable raises CollectionError naming each field.
        """
        root = Path(path)
        manifest = read_manifest(root)
        try:
            faiss_index.validate_factory(manifest.index_type, manifest.dim)
        except ConfigError as error:  # a hand-edited or damaged manifest: its index could never be built
            raise CollectionError(f"{root / MANIFEST_NAME}: {error}. Fix \"index\": {{\"type\": ...}} there, or "
                                  f"restore the file from a backup") from None
        if expect is not None:
            errors = manifest.compatibility_errors(expect)
            if errors:
                raise settings_mismatch(root, errors)
        lock_fd = acquire_lock(root) if writable else None
        store = None
        try:
            if writable:
                directory.refuse_links(root)
            store = MetaStore(root, writable=writable)
            state = store.state()
            directory.refuse_database_behind(root, manifest, state)
            if writable:
                parts.remove_orphans(root, store.named_parts(), state["next_part"], state.get("retired_below", 0))
                directory.remove_temp_files(root)  # torn index/manifest writes
        except BaseException:
            if store is not None:
                store.close()
            if lock_fd is not None:
                os.close(lock_fd)
            raise
        col = cls(root, manifest, store, lock_fd)
        col._expect = expect
        return col

    @classmethod
    def erase(cls, path: str | Path, *, for_create: bool = False) -> bool:
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
            if self._lock_fd is not None:
                os.close(self._lock_fd)  # closing the fd releases the flock
                self._lock_fd = None

    def __enter__(self) -> "Collection":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def require_compatible(self, request: Manifest) -> None:
        """CollectionError naming every setting in which `request` (e.g. a model loaded after the
        collection was opened) would produce vectors not comparable with the stored ones."""
        errors = self._manifest.compatibility_errors(request)
        if errors:
            raise settings_mismatch(self.root, errors)

    def _follow_reindex(self) -> None:
        """A reader whose collection was erased and created again since it opened (`index
        --reindex`: a new generation token) switches to the new one, so it never returns items
        that are gone or ids that now name other files. CollectionError when the collection is
        gone. Writers hold the lock, so no erase can happen under them."""
        if self.writable or self._closed or self._store.db.in_transaction:  # mid-search: the next call
            return
        if directory.read_generation(self.root) == self._generation:
            return
        fresh = Collection.open(self.root, expect=self._expect)
        self._store.close()
        self._manifest, self._store, self._index = fresh._manifest, fresh._store, fresh._index
        self._generation = fresh._generation
        self._parts_mapped = {}  # the new collection numbers its parts from 0 again
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
        """`delete_uris(replace_uris)`, `add(vectors, records)` and `add_failures(failures)` as
        ONE transaction, so a crash keeps all of a chunk of files or none of it (a file whose
        good pages were stored always has its failed pages recorded too). `settle`: files whose
        earlier rows were committed page range by page range without their mtime; all their
        rows get the file's size and mtime in the same transaction (the file is complete).
        Returns the ids of `records` and of `failures`. Raises InputError, storing nothing, as
        `add` and `add_failures` do."""
        self._require_writable("add items")
        vectors = check_rows(vectors, records, self._manifest.dim, self._manifest.normalized, self.root)
        for i, r in enumerate(failures):
            if not r.error:
                raise InputError(f"{self.root}: failure record {r.uri} (row {i}) has no error "
                                 f"message; set ItemRecord.error")
        check_unique(failures, self.root)
        n, n_failed = len(records), len(failures)
        if n + n_failed + len(replace_uris) + len(settle) == 0:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
        codes = self._encode(vectors) if n else vectors
        with self._store.transaction():
            state = self._store.state()
            ids = np.arange(state["next_id"], state["next_id"] + n + n_failed, dtype=np.int64)
            part = state["next_part"]
            self._store.tombstone_uris(list(replace_uris))
            try:
                if n:
                    # The part is on disk before the rows that reference it commit: a crash in
                    # between leaves an orphan file (swept on open), never a row without a vector.
                    parts.write_part(self.root, part, codes, ids[:n], self._codec().dtype,
                                     mode_of=self.root / MANIFEST_NAME)
                    crash_point("add-after-part-written")
                    self._store.insert_items(records, ids[:n], Status.OK, part)
                    self._store.insert_part(part, n)
                # After the rows: adding a uri clears its older failure rows, not these.
                self._store.insert_items(failures, ids[n:], Status.FAILED, part=None)
                self._store.set_file_stats(settle)
                self._store.set_state(next_id=state["next_id"] + n + n_failed, next_part=part + (n > 0))
            except BaseException:
                if n:
                    parts.remove_part(self.root, part)
                raise
        crash_point("add-after-commit")
        if n and self._index.index is not None:  # keep an index in memory current (read back: the stored dtype)
            older = max_part([(p, size) for p, size in self._store.parts() if p < part])
            codec = self._codec()
            self._index.append(state["epoch"], part, older, lambda: parts.read_part(self.root, part, n, codec.width)[0],
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

    def delete(self, ids: Iterable[int]) -> int:
        """Tombstone items by id (their vectors stay until `compact`). Returns how many changed;
        unknown or already deleted ids are ignored so a repeated call is harmless."""
        self._require_writable("delete items")
        with self._store.transaction():
            changed = self._store.tombstone_ids([int(i) for i in ids])
        crash_point("delete-after-commit")
        return changed

    def delete_uris(self, uris: Iterable[str]) -> int:
        """Tombstone every item (all pages) of each uri and drop its failure rows."""
        self._require_writable("delete items")
        with self._store.transaction():
            changed = self._store.tombstone_uris(list(uris))
        crash_point("delete-after-commit")
        return changed

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

    def vectors(self, ids: Iterable[int]) -> np.ndarray:
        """Stored vectors [n, dim] float32 for item ids (e.g. to copy a duplicate's vector
        instead of re-embedding it; decoded from 8-bit or binary codes when the parts keep those).
        CollectionError names ids without a stored vector."""
        self._follow_reindex()
        ids = [int(i) for i in ids]
        where = self._store.locations(ids)
        lost = [i for i in ids if where.get(i, (None, None))[0] is None]
        if lost:
            raise CollectionError(f"{self.root}: items {lost[:10]} have no stored vector "
                                  f"(unknown, failed, or compacted away)")
        sizes = dict(self._store.parts())
        out = np.empty((len(ids), self._manifest.dim), dtype=np.float32)
        by_part: dict[int, list[tuple[int, int]]] = {}
        for k, i in enumerate(ids):
            part, row = where[i]
            by_part.setdefault(part, []).append((k, row))
        codec = self._codec()
        for part, pairs in by_part.items():
            stored = self._mapped_part(part, sizes[part], codec.width)
            ks, rows = map(list, zip(*pairs))
            out[ks] = codec.decode(stored[rows])
        return out

    def _mapped_part(self, part: int, n_rows: int, width: int) -> np.ndarray:
        """The memory-mapped codes of a part, mapped once (part numbers are never reused, so a
        mapping never goes stale; parts a compact removed are dropped from the cache)."""
        mapped = self._parts_mapped.get(part)
        if mapped is None:
            if len(self._parts_mapped) >= _MAPPED_PARTS:
                live = {p for p, _ in self._store.parts()}
                self._parts_mapped = {p: m for p, m in self._parts_mapped.items() if p in live}
            mapped = self._parts_mapped[part] = parts.read_part(self.root, part, n_rows, width)[0]
        return mapped

    def iter_live(self, chunk_rows: int = 4096) -> Iterator[tuple[list[ItemRecord], np.ndarray]]:
        """Every live item with its vector, in storage order, `chunk_rows` at a time: (records,
        vectors [n, dim] float32). Memory stays bounded by one chunk whatever the collection's
        size (parts are memory-mapped), for exporting a collection to other stores."""
        if not isinstance(chunk_rows, int) or chunk_rows < 1:
            raise ConfigError(f"iter_live chunk_rows must be an int >= 1, got {chunk_rows!r}")
        codec = self._codec()
        for part, n in self._store.parts():
            vectors, _ = parts.read_part(self.root, part, n, codec.width)
            live = [(i, row) for i, row, status in self._store.part_rows(part) if status == Status.OK]
            for start in range(0, len(live), chunk_rows):
                chunk = live[start:start + chunk_rows]
                records = self._store.records([i for i, _ in chunk])
                rows = [row for _, row in chunk]
                yield [records[i] for i, _ in chunk], codec.decode(vectors[rows])

    def find_by_hashes(self, content_hashes: Iterable[str]) -> dict[str, list[ItemRecord]]:
        """Live items whose source file has one of these sha256 (see `records.content_hash`), in a
        few queries: hash -> live items in id order (hashes with no live item are absent)."""
        return self._store.records_with_hashes(content_hashes)

    def live_uris(self, under: str | None = None) -> list[str]:
        """Sorted uris that have live items or recorded failures: all of them, or `under` itself
        and the uris below it (`under` + "/..."), as `plan_scan` reports vanished files."""
        return self._store.live_uris(under)

    def live_ids(self, ids: Iterable[int]) -> set[int]:
        """The subset of `ids` that are live (searchable) items."""
        self._follow_reindex()
        return self._store.live_ids([int(i) for i in ids])

    def failures(self) -> list[ItemRecord]:
        """Items recorded by `add_failures` and not since replaced, oldest first."""
        return self._store.records_where_status(Status.FAILED)

    def plan_scan(self, files: Iterable[FileStat], under: str | None = None,
                  retry_failed: bool = False) -> ScanPlan:
        """Split scanned files by (uri, size, mtime) against the live items.

        under: only uris equal to this prefix or below it (a path + "/") can be reported
            vanished, so scanning one folder never tombstones items of another.
        retry_failed: report unchanged files that failed last time as changed.
        """
        known = self._store.live_file_stats()
        new, changed, unchanged, seen = [], [], [], set()
        for f in files:
            seen.add(f.uri)
            prev = known.get(f.uri)
            if prev is None:
                new.append(f)
            elif (prev[0], prev[1]) != (f.size, f.mtime) or (retry_failed and prev[2] == Status.FAILED):
                changed.append(f)
            else:
                unchanged.append(f)
        prefix = None if under is None else under.rstrip("/")
        vanished = sorted(u for u in known if u not in seen and (
            prefix is None or u == prefix or u.startswith(prefix + "/")))
        return ScanPlan(tuple(new), tuple(changed), tuple(unchanged), tuple(vanished))

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
        return self.search_records(queries, k, nprobe, ef_search, where, rescore)[:2]

    def search_records(self, queries: np.ndarray, k: int, nprobe: int | None = None, ef_search: int | None = None,
                       where: SearchFilter | None = None,
                       rescore: int | None = None) -> tuple[np.ndarray, np.ndarray, dict[int, ItemRecord]]:
        """`search`, plus the records of the ids found ({id: record}), all read from one
        snapshot of the collection: a search running while a writer adds, deletes or compacts
        sees the rows and parts of one moment, and never returns an item tombstoned before it.

        A compact that replaces the parts after the snapshot began unlinks files the snapshot
        lists; the search then starts over on the newer parts (a few times at most).
        """
        queries = self._check_search(queries, k)
        scores, ids, records = self._in_snapshot(lambda: self._search_snapshot(queries, k, nprobe, ef_search, where, rescore))
        return scores, ids, records

    def find(self, k: int, *, queries: np.ndarray | None = None, texts: Sequence[str] | None = None,
             mode: str = "dense", where: SearchFilter | None = None, nprobe: int | None = None,
             ef_search: int | None = None, rescore: int | None = None, lexical_syntax: bool = False) -> search.Found:
        """Search by vectors (mode "dense", = `search_records`), by words (mode "lexical": BM25 over
        the items' text, file names, path words and metadata values; needs no vectors) or by both
        (mode "hybrid": reciprocal-rank fusion of the two lists, each `search.hybrid_depth(k)` deep).

        queries: [q, dim] float32 (dense, hybrid); texts: q query strings (lexical, hybrid), searched
        as plain words unless `lexical_syntax` (FTS5 syntax: AND, OR, NOT, "phrases", prefix*; an
        invalid expression raises InputError); where filters both sides. Returns `search.Found`,
        whose `sources` say which side found each hit. Read from one snapshot, as `search_records`.
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

        def run() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            lists = []
            if mode != "lexical":
                lists.append(self._search_snapshot(queries, depth, nprobe, ef_search, where, rescore))
            if mode != "dense":
                lists.append(self._lexical_snapshot(list(texts), depth, where, lexical_syntax))
            if mode == "hybrid":
                return search.fuse_rrf([lists[0][1], lists[1][1]], k)
            scores, ids = lists[0]
            side = search.FOUND_DENSE if mode == "dense" else search.FOUND_LEXICAL
            return scores, ids, np.where(ids >= 0, side, 0)

        scores, ids, sources, records = self._in_snapshot(run)
        return search.Found(scores, ids, sources, records)

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

    def _in_snapshot(self, run: Callable[[], tuple]) -> tuple:
        """`run()` (arrays whose second is ids [q, k]) and the records of the ids found, read in
        one snapshot of the collection: a search running while a writer adds, deletes or compacts
        sees the rows and parts of one moment, and never returns an item tombstoned before it.

        A compact that replaces the parts after the snapshot began unlinks files the snapshot
        lists; the search then starts over on the newer parts (a few times at most)."""
        for attempt in range(_SNAPSHOT_ATTEMPTS):
            with self._store.read_snapshot():
                epoch = self._store.state()["epoch"]
                try:
                    result = run()
                    ids = result[1]
                    return (*result, self._store.records(sorted({int(i) for i in ids[ids >= 0]})))
                except parts.PartMissing:
                    if self.writable or attempt == _SNAPSHOT_ATTEMPTS - 1:
                        raise
            if self._store.state()["epoch"] == epoch:  # no compact since: the file is really gone
                raise CollectionError(f"{self.root}: a vector part is missing; the collection is damaged — "
                                      f"re-index it with `--reindex`")
            log.debug("%s: parts of epoch %d replaced during a search; searching again", self.root, epoch)
        raise AssertionError("unreachable")

    def _lexical_snapshot(self, texts: list[str], k: int, where: SearchFilter | None,
                          syntax: bool) -> tuple[np.ndarray, np.ndarray]:
        """BM25 top-k of each query text: (scores [q, k], ids [q, k]), -inf / -1 padded."""
        if not self._store.has_lexical_index():
            raise CollectionError(f"{self.root}: the collection predates lexical search; open it for writing once "
                                  f"to build its lexical index (faste-mm rebuild-index)")
        scores, ids = search.empty_hits(len(texts), k)
        for row, text in enumerate(texts):
            match = text if syntax else search.fts_query(text)
            if not match.strip():
                continue
            hits = self._store.lexical_search(match, k, where)
            if hits:
                ids[row, :len(hits)], scores[row, :len(hits)] = zip(*hits)
        return scores, ids

    def items_without_text(self) -> list[ItemRecord]:
        """Live items the lexical index knows only by name and metadata (stored before it existed)."""
        return self._store.items_without_text()

    def texts(self, ids: Iterable[int]) -> dict[int, str]:
        """The lexical text stored for these items ({id: text}; items without text are absent)."""
        return self._store.texts([int(i) for i in ids]) if self._store.has_lexical_index() else {}

    def set_texts(self, texts: Sequence[tuple[int, str]]) -> None:
        """Give live items their text in the lexical index: [(id, text)] (`rebuild-index` fills
        in the items of `items_without_text` from their files), in one transaction."""
        self._require_writable("index text")
        with self._store.transaction():
            self._store.set_texts(texts)

    def lexical_ids(self) -> list[int]:
        """Ids in the lexical index, ascending: the live items (a check that it kept in step)."""
        return self._store.lexical_ids()

    def _search_snapshot(self, queries: np.ndarray, k: int, nprobe: int | None, ef_search: int | None,
                         where: SearchFilter | None, rescore: int | None) -> tuple[np.ndarray, np.ndarray]:
        """Stage 1: the index's best `k x oversample` live (and matching) candidates; stage 2, when
        the stored copy is finer than the index's codes: rescore them exactly from it."""
        index = self._current_index()
        if index.ntotal == 0 or len(queries) == 0:
            return search.empty_hits(len(queries), k)
        oversample = self._oversample(rescore)
        k_index = k * oversample

        def search_index(q: np.ndarray, k_fetch: int, allowed: np.ndarray | None = None):
            return self._index.search(q, k_fetch, nprobe, ef_search, allowed=allowed)

        if where is not None and not where.is_empty:
            scores, ids = self._search_filtered(queries, k_index, search_index, self._store.filtered_ids(where))
        else:
            # Over-fetch only when tombstones exist; then grow 4x for queries still short of k.
            has_tombstones = self._store.n_tombstoned_vectors() > 0
            k_fetch = min(index.ntotal, 2 * k_index if has_tombstones else k_index)

            def is_live(found: np.ndarray) -> np.ndarray:
                if not has_tombstones:  # every vector in the index is live
                    return np.ones(found.shape, dtype=bool)
                live = self._store.live_ids(np.unique(found[found >= 0]).tolist())
                return np.isin(found, np.fromiter(live, dtype=np.int64, count=len(live)))

            scores, ids = search.overfetch(search_index, queries, k_index, k_fetch, index.ntotal, is_live)
        if self._rescores and rescore != 0:
            return search.rescore(queries, ids, k, self.vectors)
        return scores, ids

    @property
    def _rescores(self) -> bool:
        """Whether the stored vectors score more exactly than the index (quantized or PQ codes)."""
        return quantization.rescores(faiss_index.factory_precision(self._index.factory or "Flat"),
                                     self._manifest.stored_precision)

    def _oversample(self, rescore: int | None) -> int:
        """Candidates per wanted hit: `rescore` (0 = no rescoring), else the index precision's default."""
        if rescore is not None and (not isinstance(rescore, int) or rescore < 0):
            raise ConfigError(f"rescore must be an int >= 0 (candidates per hit; 0 = none), got {rescore!r}")
        if not self._rescores or rescore == 0:
            return 1
        return rescore or search.DEFAULT_RESCORE[faiss_index.factory_precision(self._index.factory or "Flat")]

    def _search_filtered(self, queries: np.ndarray, k: int, search_index, allowed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`search` restricted to the live ids `allowed` [n] (sorted): an exact search over their stored
        vectors when few match (`search.filter_is_selective`), else an id selector where the index
        takes one, over-fetching where it does not (a GPU copy, binary IVF), then an exact search
        over the allowed vectors for any row still short of min(k, n): an approximate index (HNSW's
        graph, IVF's probed lists) can miss matches of a selective filter."""
        scores, ids = search.empty_hits(len(queries), k)
        if len(allowed) == 0:
            return scores, ids
        if search.filter_is_selective(len(allowed), self._index.index.ntotal):  # reading them is cheaper
            return search.exact_search(queries, allowed, k, self.vectors)
        want = min(k, len(allowed))
        ntotal = self._index.index.ntotal
        if self._index.can_select:
            scores[:, :want], ids[:, :want] = search_index(queries, want, allowed)
        else:
            scores, ids = search.overfetch(search_index, queries, k, min(ntotal, 2 * k), ntotal,
                                           lambda found: np.isin(found, allowed))
        short = np.flatnonzero((ids >= 0).sum(axis=1) < want)
        if len(short):
            log.debug("%s: %d filtered queries searched exactly over %d items", self.root, len(short), len(allowed))
            scores[short], ids[short] = search.exact_search(queries[short], allowed, k, self.vectors)
        return scores, ids

    # ---- index maintenance -----------------------------------------------------------------
    def _current_index(self):
        """The derived index, brought up to every committed part (see `DerivedIndex.current`)."""
        return self._index.current(self._store.state()["epoch"], self._store.parts(), self._saved_manifest,
                                   self._manifest)

    def update_settings(self, **changes) -> None:
        """Record settings that leave stored vectors comparable (FastE's threshold for new
        documents); model, dim, instruction and pixel bounds are fixed for a collection."""
        self._require_writable("change its settings")
        fixed = sorted(set(changes) - {"fast_e"})
        if fixed:
            raise CollectionError(f"{self.root}: {', '.join(fixed)} cannot change in place; re-index with --reindex")
        self._manifest = self._manifest.replace(**changes)
        write_manifest(self.root, self._manifest)

    def save_index(self) -> None:
        """Bring the index up to date and write index.faiss + manifest (after a long add run,
        so that a crash later costs no rebuild). Called by close()."""
        self._require_writable("save the index")
        self._current_index()
        digest = self._index.save()
        crash_point("index-after-replace")
        # Manifest after the index file: a crash in between leaves a manifest describing an
        # older index, whose checksum the new file fails on loading, so the index is rebuilt.
        epoch, covered = self._index.key
        self._manifest = self._manifest.replace(
            index_factory=self._index.factory, index_epoch=epoch, index_max_part=covered,
            index_sha256=digest, counts=self._store.counts())
        write_manifest(self.root, self._manifest)

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
        committed = self._store.parts()
        try:
            self._index.build(committed, desired_factory(self._manifest, committed), self._manifest)
        except BaseException:
            self._manifest = previous  # a failed switch is not recorded (close would retry it)
            raise
        self._index.key = (self._store.state()["epoch"], max_part(committed))
        self.save_index()
        return self._index.factory

    def _finalize(self) -> None:
        """At close: switch index kind if the collection outgrew it, save if anything changed."""
        committed = self._store.parts()
        saved = self._saved_manifest()
        key = (self._store.state()["epoch"], max_part(committed))
        desired = desired_factory(self._manifest, committed)
        if committed and (self._index.factory or saved.index_factory) != desired:
            log.info("%s: index type changes to %s for %d vectors", self.root, desired,
                     sum(n for _, n in committed))
            self.rebuild_index()
        elif (saved.index_epoch, saved.index_max_part) != key and committed:
            self.save_index()
        elif saved.counts != self._store.counts():
            self._manifest = self._manifest.replace(counts=self._store.counts())
            write_manifest(self.root, self._manifest)

    def compact(self) -> int:
        """Drop tombstoned vectors from the parts, merge small parts, and rebuild the index.

        New parts are written and renamed first, then one transaction repoints the items and
        deletes the tombstones, then old part files are unlinked: a crash at any point leaves
        either the old or the new layout (plus orphans swept on open). Returns vectors dropped.
        """
        self._require_writable("compact it")
        committed = self._store.parts()
        n_dead = self._store.n_tombstoned_vectors()
        n_live = sum(n for _, n in committed) - n_dead
        if n_dead == 0 and len(committed) <= max(1, -(-n_live // COMPACT_PART_ROWS)):
            return 0
        state = self._store.state()
        next_part, moves, new_parts = state["next_part"], [], []
        buf_v: list[np.ndarray] = []
        buf_ids: list[np.ndarray] = []

        def flush() -> None:
            nonlocal next_part
            v, i = np.concatenate(buf_v), np.concatenate(buf_ids)
            parts.write_part(self.root, next_part, v, i, codec.dtype, mode_of=self.root / MANIFEST_NAME)
            moves.extend((next_part, row, int(item)) for row, item in enumerate(i))
            new_parts.append((next_part, len(i)))
            next_part += 1
            buf_v.clear()
            buf_ids.clear()

        codec = self._codec()
        for part, n in committed:
            vectors, ids = parts.read_part(self.root, part, n, codec.width)
            status = {i: s for i, _, s in self._store.part_rows(part)}
            keep = np.array([status.get(int(i)) == Status.OK for i in ids], dtype=bool)
            for start in range(0, int(keep.sum()), COMPACT_PART_ROWS):
                sel = np.flatnonzero(keep)[start:start + COMPACT_PART_ROWS]
                buf_v.append(np.asarray(vectors[sel]))
                buf_ids.append(ids[sel])
                if sum(len(b) for b in buf_ids) >= COMPACT_PART_ROWS:
                    flush()
        if buf_ids:
            flush()
        crash_point("compact-after-new-parts")
        with self._store.transaction():
            self._store.purge_tombstones()
            self._store.move_rows(moves)
            for part, _ in committed:
                self._store.delete_part(part)
            for part, n in new_parts:
                self._store.insert_part(part, n)
            # Every part below the old next_part is now retired (the sweep's `retired_below`).
            self._store.set_state(next_part=next_part, epoch=state["epoch"] + 1, retired_below=state["next_part"])
        crash_point("compact-after-commit")
        # A reader whose snapshot began before the commit may still read the old files; it
        # retries on the new epoch when they are gone (see `search`).
        for part, _ in committed:
            parts.remove_part(self.root, part)
        self._parts_mapped.clear()  # frees the removed files' space
        log.info("%s: compacted %d parts into %d, dropped %d deleted vectors", self.root,
                 len(committed), len(new_parts), n_dead)
        self.rebuild_index()
        return n_dead

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
            size_bytes=size, failures=tuple(self.failures()), exclusions=tuple(self.exclusions()))

"""Retriever: the collection-level API. Composes the Embedder (documents with the collection's
FastE r_max, queries with the full forward and a query instruction) with a Collection on disk:
incremental, crash-safe indexing of files and folders, search by text or image, add and delete.

Receives paths, texts, images and queries; hands back the records of `faste_mm.retrieval.results`
(`IndexReport`, `AddReport`, `RemoveReport`, ranked `Hit`s).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

import numpy as np
from PIL import Image

from faste_mm.model.backbones.loading import check_local_path
from faste_mm.model.batching import BatchingConfig
from faste_mm.retrieval.calibrations import Calibration, check_collection_target, load_calibration
from faste_mm.model.faste import FastEConfig
from faste_mm.model.embedder import Embedder, EmbedResult, OnError, one_or_many
from faste_mm.errors import ConfigError, InputError
from faste_mm.indexers import Collection, CollectionInfo, ItemRecord, Manifest, SearchFilter
from faste_mm.indexers.faiss_index import check_factory_syntax, validate_factory
from faste_mm.indexers.manifest import MANIFEST_NAME, CollectionFastE, read_manifest, settings_mismatch
from faste_mm.indexers.records import repeated_key
from faste_mm.retrieval.ingest import (IndexFailure, IngestTally, ScanFilter, failure_reasons, honour_exclusions,
                             ingest_chunk, plan_update, record_missing, scan_paths)
from faste_mm.model.items import Item, as_item
from faste_mm.model.runner import BatchTrace
from faste_mm.retrieval import maintenance
from faste_mm.retrieval.export import ExportReport, export_parquet
from faste_mm.retrieval.maintenance import collection_path
from faste_mm.retrieval.results import AddReport, Hit, IndexOptions, IndexProgress, IndexReport, RemoveReport
from faste_mm.model.serialization import DEFAULT_INSTRUCTION, SerializerConfig
from faste_mm.model.video import VideoConfig

if TYPE_CHECKING:
    from faste_mm.scale import RayOptions

log = logging.getLogger(__name__)

# The Qwen3-VL-Embedding model card's example retrieval instruction.
DEFAULT_QUERY_INSTRUCTION = "Retrieve images or text relevant to the user's query."


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """How to load the embedding model when it is first needed (see `Retriever.open`)."""

    model_id: str
    revision: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    batching: BatchingConfig | None = None
    serializer: SerializerConfig | None = None

    @property
    def name(self) -> str:
        """The model id the loaded Embedder reports: a local directory by its absolute path, so
        `Retriever.open` finds it again from any working directory; a hub id as given."""
        local = Path(self.model_id).expanduser()
        return str(local.resolve()) if local.is_dir() else self.model_id

    def load(self) -> Embedder:
        return Embedder.from_pretrained(self.name, device=self.device, dtype=self.dtype, revision=self.revision,
                                        batching=self.batching, serializer=self.serializer)

    def conflicts(self, manifest: Manifest) -> list[str]:
        """The collection settings this model is known to differ in before it loads (id, revision
        and the video settings given; dim, instruction and pixel bounds are checked once it has loaded)."""
        request = {"model_id": self.name, "model_revision": self.revision}
        if self.serializer is not None:
            request["video"] = self.serializer.video.to_dict()
        return manifest.differences(request)


class Retriever:
    """Index files into a collection and search it.

    Example:
        >>> r = Retriever.from_pretrained("Qwen/Qwen3-VL-Embedding-2B", r_max=0.5)
        >>> r.index(["./images", "report.pdf"], collection="./my-collection")
        >>> r.search("a red bicycle", k=10)  # [Hit(id=.., score=.., uri=.., page=.., metadata=..)]

    model: a loaded `Embedder`, or a `ModelSpec` loaded on first use (so info/remove/compact
        never load weights). r_max: FastE ratio for documents of NEW collections (an existing
        collection keeps its own). query_instruction: None = DEFAULT_QUERY_INSTRUCTION for
        vision-language models, the model's own default query task for text models.
        dim: Matryoshka width of NEW collections: documents and queries keep their first `dim`
        dimensions, re-normalised (smaller index, faster search, some quality lost); None = the
        model's full width. A collection's dim is fixed: another one is refused like a model change.
    """

    def __init__(self, model: Embedder | ModelSpec, *, collection: str | Path | None = None,
                 r_max: float = 0.5, query_instruction: str | None = None, threshold: float | None = None,
                 dim: int | None = None) -> None:
        FastEConfig(r_max=r_max, threshold=threshold)  # validates both with a ConfigError
        if dim is not None and (isinstance(dim, bool) or not isinstance(dim, int) or dim < 1):
            raise ConfigError(f"Retriever dim must be None (the model's width) or an int >= 1, got {dim!r}")
        self.dim = dim
        self.threshold = threshold  # theta for NEW collections; None: saved calibration, else default
        self._embedder = model if isinstance(model, Embedder) else None
        self._spec = model if isinstance(model, ModelSpec) else None
        if self._embedder is None and self._spec is None:
            raise ConfigError(f"Retriever model must be an Embedder or a ModelSpec, got {type(model).__name__}")
        self.collection = collection_path(collection)
        self.r_max = float(r_max)
        self.query_instruction = query_instruction
        self._reader: Collection | None = None

    @classmethod
    def from_pretrained(cls, model: str, r_max: float = 0.5, *, collection: str | Path | None = None,
                        device: str = "auto", dtype: str = "auto", revision: str | None = None,
                        batching: BatchingConfig | None = None,
                        query_instruction: str | None = None, threshold: float | None = None,
                        dim: int | None = None) -> "Retriever":
        """Load `model` (hub id or local directory) now. Raises ModelLoadError."""
        spec = ModelSpec(model, revision, device, dtype, batching)
        return cls(spec.load(), collection=collection, r_max=r_max, query_instruction=query_instruction,
                   threshold=threshold, dim=dim)

    @classmethod
    def open(cls, collection: str | Path | None = None, *, device: str = "auto", dtype: str = "auto",
             batching: BatchingConfig | None = None, query_instruction: str | None = None) -> "Retriever":
        """A retriever for an existing collection, using the model, revision, pixel settings and
        r_max and dim named in its manifest (loaded when first needed). Raises CollectionError."""
        root = collection_path(collection)
        m = read_manifest(root)  # the settings only: no database connection needed
        serializer = SerializerConfig(min_pixels=m.min_pixels, max_pixels=m.max_pixels, video=VideoConfig(**m.video))
        spec = ModelSpec(m.model_id, m.model_revision, device, dtype, batching, serializer)
        return cls(spec, collection=root, r_max=m.r_max, query_instruction=query_instruction, dim=m.dim)

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            self._embedder = self._spec.load()
        return self._embedder

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def __enter__(self) -> "Retriever":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- settings --------------------------------------------------------------------------
    def document_manifest(self, index_type: str = "auto") -> Manifest:
        """The collection settings this retriever's documents are embedded with."""
        emb = self.embedder
        config = emb.serializer.config if emb.family.is_multimodal else SerializerConfig()
        fast_e = None
        if self.r_max > 0:
            threshold, source = self._threshold(emb)
            resolved = emb.resolve_fast_e(FastEConfig(r_max=self.r_max, threshold=threshold))
            fast_e = CollectionFastE(resolved.r_max, resolved.warmup_layer, resolved.threshold, source)
        dim = emb.dim if self.dim is None else self.dim
        if dim > emb.dim:
            raise ConfigError(f"dim {dim} is wider than {emb.model_id}'s embeddings ({emb.dim}); "
                              f"choose a dim between 1 and {emb.dim}")
        return Manifest(
            model_id=emb.model_id, dim=dim, model_dim=emb.dim, model_revision=emb.loaded.revision,
            document_instruction=DEFAULT_INSTRUCTION, min_pixels=config.min_pixels, max_pixels=config.max_pixels,
            video=config.video.to_dict(), fast_e=fast_e, index_type=index_type)

    def _threshold(self, emb: Embedder) -> tuple[float | None, str]:
        """theta for a new collection: --threshold, else this model's saved calibration, else the
        backbone default; with where it came from (shown by `info`)."""
        if self.threshold is not None:
            return self.threshold, "given (--threshold)"
        calibration = load_calibration(emb.model_id, emb.loaded.revision)
        if calibration is None or calibration.threshold is None:
            return None, f"backbone default ({emb.family.name})"
        if calibration.r_max != self.r_max:
            log.info("using theta %g calibrated at r_max %g for r_max %g", calibration.threshold,
                     calibration.r_max, self.r_max)
        return calibration.threshold, calibration.describe()

    def _collection_fast_e(self, col: Collection) -> FastEConfig | None:
        """Documents always use the collection's FastE settings, so all its vectors match."""
        fast_e = col.manifest.fast_e
        theirs = col.manifest.r_max
        if self.r_max != theirs:
            log.warning("%s: the collection embeds documents with r_max=%g; ignoring r_max=%g "
                        "(re-index with --reindex to change it)", col.root, theirs, self.r_max)
        if fast_e is None:
            return None
        return FastEConfig(r_max=fast_e.r_max, warmup_layer=fast_e.warmup_layer, threshold=fast_e.threshold)

    def _target(self, collection: str | Path | None) -> Path:
        if collection is not None:
            self.close()
            self.collection = collection_path(collection)
        return self.collection

    def _writer(self) -> Collection:
        """The collection opened for writing (CollectionError at once if another writer holds it)."""
        self.close()
        return Collection.open(self.collection, writable=True)

    def _index_writer(self, root: Path, index_type: str) -> Collection:
        """The collection to index into, opened for writing. A new one is created, which needs the
        model (its dim and revision go into the manifest); an existing one is opened without
        loading it, refusing at once a model whose id or revision differs (the rest is checked
        when the model loads, see `_CollectionDocuments`) and an index type FAISS cannot build
        (else found only after every file is embedded)."""
        if self._embedder is None and (root / MANIFEST_NAME).exists():
            manifest = read_manifest(root)
            errors = self._spec.conflicts(manifest)
            if self.dim is not None:
                errors += manifest.differences({"dim": self.dim})
            if errors:
                check_local_path(self._spec.model_id)  # a mistyped path is "not found", not another model
                raise settings_mismatch(root, errors)
            validate_factory(index_type, manifest.dim)
            return Collection.open(root, writable=True)
        return Collection.create(root, self.document_manifest(index_type), exist_ok=True)

    def _erase_for_reindex(self, root: Path, index_type: str) -> None:
        """Erase the collection for `index --reindex`, once nothing that follows can refuse: the
        model loads (re-indexing embeds everything anyway), the index type must suit its dim,
        and the folder must hold nothing that would stop `Collection.create`. Raises
        ModelLoadError, ConfigError or CollectionError with the collection untouched."""
        manifest = self.document_manifest(index_type)
        validate_factory(index_type, manifest.dim)
        Collection.erase(root, for_create=True)

    # ---- indexing --------------------------------------------------------------------------
    def index(self, paths: Iterable[str | Path], collection: str | Path | None = None,
              options: IndexOptions | None = None,
              progress: Callable[[IndexProgress], None] | None = None,
              ray: "RayOptions | None" = None) -> IndexReport:
        """Bring a collection up to date with files and folders (images, PDFs page by page,
        .txt/.md as text). Only new or changed files are embedded; files whose content matches a
        live item reuse its vectors; files gone from an indexed folder are removed. Work is
        committed every `options.chunk_files` files, so an interrupted run resumes where it
        stopped. Bad files are recorded as failures, never raised.

        collection: where to index (and search from then on); None = the retriever's.
        ray: run the embedding on Ray Data, e.g. `faste_mm.scale.RayOptions("auto")` (needs
            faste-mm[ray]): the same plan and commits, decoding and embedding spread over a cluster.

        Raises CollectionError (settings differ from the collection, another writer holds it),
        ConfigError (bad options or index type), InputError (no paths given).
        """
        options = options or IndexOptions()
        if options.index_type is not None:
            check_factory_syntax(options.index_type)  # before any model loads or anything is erased
        if ray is not None and not hasattr(ray, "ingest_plan"):
            raise ConfigError(f"index: ray must be a faste_mm.scale.RayOptions, got {ray!r}")
        started = time.perf_counter()
        root = self._target(collection)
        scan = scan_paths(paths, ScanFilter(options.exclude, options.include_hidden))
        self.close()
        if options.reindex:
            self._erase_for_reindex(root, options.index_type or "auto")
        tally = IngestTally()
        with self._index_writer(root, options.index_type or "auto") as col:
            scan = honour_exclusions(col, scan)  # paths removed earlier stay out of folder scans
            encode = _CollectionDocuments(self, col)
            plan = plan_update(col, scan, options.retry_failed)
            col.mark_vanished(plan.vanished)
            if scan.missing:
                record_missing(col, scan.missing, tally)

            done, chunk_size = 0, 0

            def report_progress(trace: BatchTrace | None = None) -> None:
                if progress is None:
                    return
                flight = encode.in_flight  # batches of the chunk being embedded, not yet in the tally
                share = (done + chunk_size * min(1.0, flight.rows / flight.inputs) if flight.inputs else done)
                progress(IndexProgress(done, len(plan.todo), tally.embedded + flight.rows, tally.reused,
                                       len(tally.failures), tally.prefix_tokens + flight.prefix_tokens,
                                       tally.kept_prefix_tokens + flight.kept_prefix_tokens,
                                       time.perf_counter() - started,
                                       share / len(plan.todo) if plan.todo else 1.0,
                                       tally.tower_s + flight.tower_s, tally.decoder_s + flight.decoder_s))

            def files_committed(n: int) -> None:  # the Ray pipeline's commits
                nonlocal done
                done = n
                report_progress()

            encode.on_batch = report_progress
            report_progress()
            if ray is not None:  # the same plan and commits; decoding and embedding on a Ray Data pipeline
                ray.ingest_plan(self, col, plan, options.chunk_files, tally, files_committed)
            else:
                for start in range(0, len(plan.todo), options.chunk_files):
                    chunk = plan.todo[start:start + options.chunk_files]
                    chunk_size = len(chunk)
                    ingest_chunk(col, chunk, plan.changed, encode, tally)
                    done, chunk_size = start + len(chunk), 0
                    report_progress()
            if options.index_type is not None and options.index_type != col.manifest.index_type:
                col.rebuild_index(options.index_type)
        factory = col.manifest.index_factory  # as saved by close(), which brought index.faiss up to date
        seconds = time.perf_counter() - started
        log.info("%s: embedded %d items, reused %d, %d files unchanged, %d removed, %d failed in %.1f s",
                 root, tally.embedded, tally.reused, plan.n_unchanged, len(plan.vanished), len(tally.failures), seconds)
        return IndexReport(str(root), len(scan.files()), tally.embedded, tally.reused, plan.n_unchanged,
                           len(plan.vanished),
                           len(tally.failures), tuple(tally.failures), tally.prefix_tokens,
                           tally.kept_prefix_tokens, seconds, factory, scan.n_excluded, tally.tower_s, tally.decoder_s)

    def pending(self, paths: Iterable[str | Path], options: IndexOptions | None = None) -> int:
        """How many files `index(paths, options=options)` would embed (or reuse) now: the new
        and changed ones (and, with retry_failed, those that failed); every file when the
        collection does not exist yet. Reads only (no model, no writer lock), so it can tell
        what an interrupted `index` still has to do."""
        options = options or IndexOptions()
        scan = scan_paths(paths, ScanFilter(options.exclude, options.include_hidden))
        if not (self.collection / MANIFEST_NAME).exists():
            return len(scan.files())
        with Collection.open(self.collection) as col:
            return len(plan_update(col, scan, options.retry_failed).todo)

    # ---- adding and removing ---------------------------------------------------------------
    def add(self, items: Sequence[object], metadata: Sequence[Mapping[str, Any] | None] | None = None,
            uris: Sequence[str] | None = None, on_error: OnError = "raise") -> AddReport:
        """Embed items (str text, Path/PIL image, PDF path = all pages, `Item`) as documents and
        add them, with optional per-item metadata and uris. A PDF's pages share its metadata.
        Default uri: a file's resolved path, else "item:<sha256 of the content and the
        metadata>[:16]": the same text with different metadata is two items, the same text with
        the same metadata one. Re-adding a (uri, page) replaces the old item (so re-adding a file
        updates its metadata); pass `uris` to choose the identity yourself.

        on_error: "raise" stops at the first item that cannot be embedded (InputError naming it)
            and stores nothing; "skip" stores the others and records each bad row as a failure,
            as `index` does with bad files (listed by `info()` until its uri is added again).
        Returns an `AddReport`: ids [n_rows] int64 (-1 for failed rows) and the failures.
        Raises InputError, storing nothing, whatever on_error: metadata/uris of the wrong length;
        two rows with one (uri, page), failed rows included; an `Item.max_pixels` other than the
        collection's (its vectors would not be comparable). ConfigError for a bad on_error.
        """
        if on_error not in ("raise", "skip"):
            raise ConfigError(f"add: on_error must be 'raise' or 'skip', got {on_error!r}")
        items = list(items)
        for name, values in (("metadata", metadata), ("uris", uris)):
            if values is not None and len(values) != len(items):
                raise InputError(f"add: {len(values)} {name} for {len(items)} items; give one per item")
        with Collection.create(self.collection, self.document_manifest(), exist_ok=True) as col:
            result = _CollectionDocuments(self, col)(items, on_error)
            reasons = failure_reasons(result)
            if reasons and on_error == "raise":  # only non-finite vectors get here: encode raised the rest
                row = min(reasons)
                raise InputError(f"add: input {result.sources[row]}: {reasons[row]}",
                                 hint="or pass on_error='skip' to store the other items")
            records = [_add_record(result.items[row], None if uris is None else uris[source],
                                   None if metadata is None else metadata[source], reasons.get(row))
                       for row, source in enumerate(result.sources)]
            _refuse_repeated_rows(records, result.sources)  # before any write: all rows or none
            ok = np.array([row not in reasons for row in range(len(records))], dtype=bool)
            failed = [records[row] for row in sorted(reasons)]
            ids = np.full(len(records), -1, dtype=np.int64)
            ids[ok] = col.add(result.embeddings[ok], [r for r, is_ok in zip(records, ok) if is_ok])
            col.add_failures(failed)  # after add: adding a uri clears its failure rows
        self.close()
        if failed:
            log.info("%s: added %d items, %d failed", self.collection, int(ok.sum()), len(failed))
        return AddReport(ids, tuple(IndexFailure(r.uri, r.page, r.error) for r in failed))

    def delete(self, ids: Iterable[int]) -> int:
        """Tombstone items by id; returns how many were live."""
        with self._writer() as col:
            return col.delete(ids)

    def remove(self, paths: Iterable[str | Path] = (), ids: Iterable[int] = ()) -> RemoveReport:
        """Remove every item of each file or folder, and the items with these ids (see
        `maintenance.remove_items`)."""
        self.close()
        return maintenance.remove_items(self.collection, paths, ids)

    def compact(self) -> int:
        """Drop deleted vectors from disk and rebuild the index; returns vectors dropped."""
        self.close()
        return maintenance.compact(self.collection)

    def rebuild_index(self, index_type: str | None = None) -> str:
        """Rebuild the FAISS index from stored vectors (optionally as another type); returns
        the factory string built."""
        self.close()
        return maintenance.rebuild_index(self.collection, index_type)

    def info(self) -> CollectionInfo:
        with Collection.open(self.collection) as col:
            return col.info()

    def export(self, path: str | Path) -> ExportReport:
        """Write the collection's live items and vectors to one Parquet file (see
        `faste_mm.retrieval.export`), e.g. to load them into LanceDB, Qdrant or pgvector."""
        return export_parquet(self.collection, path)

    # ---- search ----------------------------------------------------------------------------
    def search(self, query: str | None = None, *, image: str | Path | Image.Image | None = None,
               k: int = 10, instruction: str | None = None, where: Mapping[str, Any] | None = None,
               type: str | Sequence[str] | None = None, path: str | None = None,
               video: str | Path | None = None) -> list[Hit]:
        """Top-k items for a text, an image, a video, or a combination. An image or a video alone
        is a query by example: it is embedded exactly like a document (so an indexed file finds
        itself with score ~1) unless `instruction` is given.

        Filters (all must hold; k hits come back whenever k items match, whatever the index):
        where: metadata key -> value, e.g. {"tag": "invoice"} (values of `add(metadata=...)`);
        type: "image" | "pdf" | "text" | "video", or several; path: a glob on the stored path, e.g.
        "*/invoices/*" or "./photos/*" (see `faste_mm.indexers.SearchFilter`).
        Raises InputError if nothing is given, ConfigError for a bad filter."""
        if query is None and image is None and video is None:
            raise InputError("search: give a query text, an image, a video, or a combination")
        return self.search_batch([Item(text=query, image=image, video=video)], k=k, instruction=instruction,
                                 where=where, type=type, path=path)[0]

    def search_batch(self, queries: Sequence[object], k: int = 10, instruction: str | None = None,
                     where: Mapping[str, Any] | None = None, type: str | Sequence[str] | None = None,
                     path: str | None = None) -> list[list[Hit]]:
        """`search` for many queries (str text, Path/PIL image, or `Item`), one list of hits each;
        the filters apply to every query."""
        search_filter = SearchFilter(where=where or {}, types=() if type is None else type, path=path)
        items = [_as_query(q, i) for i, q in enumerate(queries)]
        if self._reader is None:
            self._reader = Collection.open(self.collection, expect=self.document_manifest())
        col = self._reader
        vectors = self._embed_queries(items, instruction, col)
        scores, ids, records = col.search_records(vectors, k, where=search_filter)  # hits and records of one snapshot
        return [[Hit(int(i), float(s), records[int(i)].uri, records[int(i)].page, records[int(i)].metadata)
                 for s, i in zip(row_scores, row_ids) if i >= 0]
                for row_scores, row_ids in zip(scores, ids)]

    def _embed_queries(self, items: list[Item], instruction: str | None, col: Collection) -> np.ndarray:
        by_example = [i for i, it in enumerate(items)
                      if instruction is None and it.instruction is None and not it.text
                      and (it.image is not None or it.video is not None)]
        with_task = [i for i in range(len(items)) if i not in set(by_example)]
        out = np.zeros((len(items), col.manifest.dim), dtype=np.float32)
        if by_example:
            out[by_example] = self.encode_documents([items[i] for i in by_example]).embeddings
        if with_task:
            out[with_task] = self.encode_queries([items[i] for i in with_task], instruction=instruction).embeddings
        return out

    # ---- encoding with the collection's settings -------------------------------------------
    def encode_queries(self, queries: Iterable[object], *, instruction: str | None = None,
                       on_error: OnError = "raise") -> EmbedResult:
        """Queries as `search` embeds them: the full forward with a task instruction
        (`instruction`, else the retriever's query_instruction, else DEFAULT_QUERY_INSTRUCTION
        for vision-language models and the model's default query task for text models)."""
        task = instruction or self.query_instruction
        if task is None and self.embedder.family.is_multimodal:
            task = DEFAULT_QUERY_INSTRUCTION
        # a Matryoshka collection's queries are truncated like its documents
        dim = self._reader.manifest.dim if self._reader is not None else None
        return self.embedder.encode_queries(queries, instruction=task, dim=dim, on_error=on_error)

    def encode_documents(self, documents: Iterable[object], *, on_error: OnError = "raise") -> EmbedResult:
        """Documents as `index` and `add` embed them into this collection: its model, pixel
        bounds and FastE settings, so the vectors compare with the stored ones. Raises
        CollectionError when the collection does not exist or the model differs from it."""
        if self._reader is None:
            self._reader = Collection.open(self.collection, expect=self.document_manifest())
        return self.embedder.encode_documents(documents, fast_e=self._collection_fast_e(self._reader),
                                              dim=self._reader.manifest.dim, on_error=on_error)

    def encode_query(self, queries: object, *, instruction: str | None = None,
                     on_error: OnError = "raise") -> EmbedResult:
        """`encode_queries` under the sentence-transformers name; one input counts as a list of one."""
        return self.encode_queries(one_or_many(queries), instruction=instruction, on_error=on_error)

    def encode_document(self, documents: object, *, on_error: OnError = "raise") -> EmbedResult:
        """`encode_documents` under the sentence-transformers name; one input counts as a list of one."""
        return self.encode_documents(one_or_many(documents), on_error=on_error)


class _CollectionDocuments:
    """Embeds documents for one open collection, with its FastE settings.

    The model is loaded on the first call, so an `index` run with nothing new to embed never
    loads it. That call also checks that the loaded model makes vectors comparable with the
    stored ones (the collection may have been opened before the model was known) and warns
    once if the retriever's r_max differs from the collection's.
    """

    def __init__(self, retriever: Retriever, col: Collection) -> None:
        self._retriever = retriever
        self._col = col
        self._fast_e: FastEConfig | None = None
        self._is_checked = False
        self.in_flight = _InFlight()  # the call in progress, batch by batch (zero between calls)
        self.on_batch: Callable[[BatchTrace], None] | None = None  # called after each batch

    def __call__(self, values: Sequence[object], on_error: OnError = "skip") -> EmbedResult:
        _refuse_other_pixel_caps(values, self._col)  # before anything is embedded
        embedder = self._retriever.embedder
        if not self._is_checked:
            self._col.require_compatible(self._retriever.document_manifest())
            self._fast_e = self._retriever._collection_fast_e(self._col)
            self._is_checked = True
        self.in_flight = _InFlight(inputs=len(values))
        try:
            # Matryoshka collections store the first `dim` dimensions, re-normalised (checked above).
            return embedder.encode_documents(values, fast_e=self._fast_e, dim=self._col.manifest.dim,
                                             on_error=on_error, on_batch=self._batch_done)
        finally:
            self.in_flight = _InFlight()  # the caller's tally counts the result from now on

    def _batch_done(self, trace: BatchTrace) -> None:
        flight = self.in_flight
        flight.rows += trace.batch_size
        flight.prefix_tokens += trace.prefix_tokens
        flight.kept_prefix_tokens += trace.kept_prefix_tokens
        flight.tower_s += trace.tower_s
        flight.decoder_s += trace.decoder_s
        if self.on_batch is not None:
            self.on_batch(trace)


@dataclass
class _InFlight:
    """Running totals of one document-encoding call (mutable: updated batch by batch)."""

    inputs: int = 0
    rows: int = 0
    prefix_tokens: int = 0
    kept_prefix_tokens: int = 0
    tower_s: float = 0.0
    decoder_s: float = 0.0


# ---- helpers ---------------------------------------------------------------------------------
def _add_record(item: Item, uri: str | None, metadata: Mapping[str, Any] | None, error: str | None) -> ItemRecord:
    """The record `add` stores for one row: an item, or (with `error`) a failure."""
    size, mtime = _file_stat(item)
    return ItemRecord(uri=uri if uri is not None else _default_uri(item, metadata), modality=_modality(item), page=item.page,
                      size=size, mtime=mtime, metadata=metadata, error=error)


def _refuse_repeated_rows(records: Sequence[ItemRecord], sources: Sequence[int]) -> None:
    """InputError when two rows of one `add` call (stored or failed) share a (uri, page): the
    second would replace the first, or its failure record would tombstone the first's item."""
    repeated = repeated_key(records)
    if repeated is not None:
        first, second = (sources[row] for row in repeated)
        record = records[repeated[1]]
        page = "" if record.page is None else f" page {record.page}"
        raise InputError(f"add: inputs {first} and {second} are both {record.uri}{page}, and a collection "
                         f"holds one item per (uri, page); nothing was stored. Add it once, or give each "
                         f"its own uri (uris=...)")


def _refuse_other_pixel_caps(values: Sequence[object], col: Collection) -> None:
    """InputError for an image item whose own `Item.max_pixels` differs from the collection's:
    it would be resized to another cap, so its vector would not be comparable with the others."""
    cap = col.manifest.max_pixels
    for position, value in enumerate(values):
        item = as_item(value, position)
        if item.has_image and item.max_pixels not in (None, cap):
            raise InputError(f"input {position} ({item.describe()}): Item.max_pixels={item.max_pixels}, but "
                             f"the collection {col.root} embeds images at max_pixels={cap}; drop max_pixels "
                             f"from the item, or add it to another collection; nothing was stored")


def _as_query(value: object, position: int) -> Item:
    item = as_item(value, position)
    if item.is_pdf and item.page is None:
        raise InputError(f"query {position}: {item.image} is a PDF; query with one page, "
                         f"Item(image=path, page=N)")
    return item


def _modality(item: Item) -> str:
    if item.video is not None:
        return "video+text" if item.text or item.image is not None else "video"
    if item.is_pdf:
        return "page"
    if item.image is not None:
        return "image+text" if item.text else "image"
    return "text"


def _default_uri(item: Item, metadata: Mapping[str, Any] | None = None) -> str:
    """A file's resolved path; else "item:" + a hash of the content AND the metadata, so the same
    text added twice with different metadata is two items, while re-adding an identical
    (content, metadata) pair replaces the stored one instead of duplicating it."""
    if item.video is not None and item.image is None and not item.text:
        return str(Path(item.video).expanduser().resolve())
    if isinstance(item.image, (str, Path)) and not item.text and item.video is None:
        return str(Path(item.image).expanduser().resolve())
    h = hashlib.sha256((item.text or "").encode("utf-8"))
    if isinstance(item.image, Image.Image):
        h.update(item.image.tobytes())
    elif item.image is not None:
        h.update(str(Path(item.image).resolve()).encode("utf-8"))
    if item.video is not None:
        h.update(b"video:" + str(Path(item.video).resolve()).encode("utf-8"))
    if metadata is not None:  # None leaves the hash as it was, so earlier uris stay valid
        h.update(b"\0metadata\0" + json.dumps(dict(metadata), sort_keys=True, default=str).encode("utf-8"))
    return "item:" + h.hexdigest()[:16]


def _file_stat(item: Item) -> tuple[int | None, float | None]:
    only_file = (item.video if item.image is None else item.image if item.video is None else None)
    if isinstance(only_file, (str, Path)) and not item.text:
        try:
            st = Path(only_file).stat()
        except OSError:  # a missing file is a failed row (on_error="skip"); it has no stat
            return None, None
        return st.st_size, st.st_mtime
    return None, None


def apply_calibration(calibration: Calibration, collection: str | Path | None) -> Path:
    """Record a calibrated theta in a collection: its new documents use it from now on (vectors
    already stored keep theirs; they stay comparable). Raises CollectionError on a model mismatch."""
    root = collection_path(collection)
    with Collection.open(root, writable=True) as col:
        manifest = col.manifest
        check_collection_target(root, manifest, calibration.model_id, calibration.revision)
        fast_e = dataclasses.replace(manifest.fast_e, threshold=calibration.threshold,
                                     warmup_layer=calibration.warmup_layer, threshold_source=calibration.describe())
        col.update_settings(fast_e=fast_e)
    return root

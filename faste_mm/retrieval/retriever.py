"""Retriever: the collection-level API. Composes the Embedder (documents with the collection's
FastE r_max, queries with the full forward and a query instruction) with a Collection on disk:
incremental, crash-safe indexing of files and folders, search by text or image, add and delete.

Receives paths, texts, images and queries; hands back the records of `faste_mm.retrieval.results`
(`IndexReport`, `AddReport`, `RemoveReport`, ranked `Hit`s). The work is in the modules it
imports: collection_settings (the profile), indexing + ingest + scanning, documents (add),
querying (search), model_spec (loading on first use).
"""
# Size: ~490 lines: the public facade, ~30 methods of a few lines each delegating to the modules above;
# most of its lines are the API's docstrings.

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterable, Mapping, Sequence

import numpy as np
from PIL import Image

from faste_mm.errors import ConfigError, InputError
from faste_mm.indexers import Collection, CollectionInfo, SearchFilter
from faste_mm.indexers.faiss_index import check_factory_syntax
from faste_mm.indexers.quantization import check_choices
from faste_mm.model.batching import BatchingConfig
from faste_mm.model.embedder import Embedder, EmbedResult, OnError, one_or_many
from faste_mm.model.items import Item
from faste_mm.model.video import VideoConfig
from faste_mm.retrieval import collection_settings, maintenance, querying
from faste_mm.retrieval.collection_settings import checked_profile, new_profile, open_for_writing, recreate
from faste_mm.retrieval.documents import CollectionDocuments, add_documents
from faste_mm.retrieval.executors import IngestExecutor, LocalExecutor, ModelSource
from faste_mm.retrieval.export import ExportReport
from faste_mm.retrieval.export import export as export_collection
from faste_mm.retrieval.indexing import index_collection
from faste_mm.retrieval.maintenance import collection_path
from faste_mm.retrieval.model_spec import ModelSpec, model_source
from faste_mm.retrieval.ingest import plan_update
from faste_mm.retrieval.profile import QUERY_INSTRUCTION, CollectionProfile, existing_profile, read_profile
from faste_mm.retrieval.receipt import PlanReceipt
from faste_mm.retrieval.rerank_hits import check_reranker, rerank_hits
from faste_mm.retrieval.results import AddReport, Hit, IndexOptions, IndexProgress, IndexReport, RemoveReport
from faste_mm.retrieval.scanning import ScanFilter, scan_paths

log = logging.getLogger(__name__)

# One constant for every front end (search, serve, eval): see faste_mm.retrieval.profile.
DEFAULT_QUERY_INSTRUCTION = QUERY_INSTRUCTION


class Retriever:
    """Index files into a collection and search it.

    Example:
        >>> r = Retriever.from_pretrained("Qwen/Qwen3-VL-Embedding-2B", r_max=0.5)
        >>> r.index(["./images", "report.pdf"], collection="./my-collection")
        >>> r.search("a red bicycle", k=10)  # [Hit(id=.., score=.., uri=.., page=.., metadata=..)]

    Safe to share across threads (a web app's workers): searches run one at a time.

    model: a loaded `Embedder`, or a `ModelSpec` loaded on first use (so info/remove/compact
        never load weights). query_instruction: None = DEFAULT_QUERY_INSTRUCTION for
        vision-language models, the model's own default query task for text models.
    r_max, warmup_layer, threshold, trigger_layer, dim, video: collection settings (see
        `CollectionProfile`). Each follows the defaults rule: an existing collection's own value,
        else the one given here, else the documented default (r_max 0.5, theta from the model's
        saved calibration or the backbone, the model's full width, VideoConfig()). A given value
        that differs from an existing collection's is refused (CollectionError naming it).
        dim: Matryoshka width: documents and queries keep their first `dim` dimensions,
        re-normalised (smaller index, faster search, some quality lost).
        video: a VideoConfig, or a mapping of some of its fields ({"fps": 2.0}).
        max_pixels: the image and page budget: each is resized to at most this many pixels
            (N visual tokens = N x 1024 px, `faste_mm.model.serialization.pixel_budget`); image
            queries of the collection are resized the same way. Default 1,843,200 (official).
        receipt: what `faste-mm plan` measured for these settings (`PlanReport.receipt(row)`),
            recorded by a NEW collection and shown by info; None = not measured.
        vectors: precision of the index in RAM, "float32" (default), "float16", "int8" (8-bit codes)
        or "binary" (sign bits); keep: the copy kept on disk to rescore with, "float" (default),
        "int8" or "none" (see README "Large collections").
    """

    def __init__(self, model: Embedder | ModelSpec, *, collection: str | os.PathLike | None = None,
                 r_max: float | None = None, query_instruction: str | None = None,
                 threshold: float | None = None, dim: int | None = None, warmup_layer: int | None = None,
                 trigger_layer: int | None = None, video: VideoConfig | Mapping[str, Any] | None = None,
                 max_pixels: int | None = None, receipt: PlanReceipt | None = None,
                 vectors: str | None = None, keep: str | None = None, reranker: str | None = None) -> None:
        given = dict(r_max=r_max, threshold=threshold, dim=dim, warmup_layer=warmup_layer,
                     trigger_layer=trigger_layer, video=video, max_pixels=max_pixels, receipt=receipt,
                     vectors=vectors, keep=keep, reranker=reranker)
        self._given = {name: value for name, value in given.items() if value is not None}
        CollectionProfile.resolve(None, **self._given)  # validates every value with a ConfigError
        check_choices(vectors, keep)  # the pair is checked with the collection's values when its manifest is made
        self._embedder = model if isinstance(model, Embedder) else None
        self._spec = model if isinstance(model, ModelSpec) else None
        if self._embedder is None and self._spec is None:
            raise ConfigError(f"Retriever model must be an Embedder or a ModelSpec, got {type(model).__name__}")
        self.collection = collection_path(collection)
        self.query_instruction = query_instruction
        self._reader: Collection | None = None
        self._reader_profile: CollectionProfile | None = None
        # One search at a time: threads (a web app's workers) share the reader (its SQLite
        # connection, FAISS index, caches) and the model; each uses all cores on its own anyway.
        self._lock = threading.RLock()
        self._adapted: Embedder | None = None  # the embedder with a collection's pixel settings

    @classmethod
    def from_pretrained(cls, model: str | os.PathLike, r_max: float | None = None, *,
                        collection: str | os.PathLike | None = None, device: str = "auto", dtype: str = "auto",
                        revision: str | None = None, batching: BatchingConfig | None = None,
                        query_instruction: str | None = None, threshold: float | None = None,
                        dim: int | None = None, warmup_layer: int | None = None,
                        trigger_layer: int | None = None, max_pixels: int | None = None,
                        receipt: PlanReceipt | None = None, vectors: str | None = None,
                        keep: str | None = None) -> "Retriever":
        """Load `model` (hub id or local directory) now. Raises ModelLoadError."""
        spec = ModelSpec(model, revision, device, dtype, batching)
        return cls(spec.load(), collection=collection, r_max=r_max, query_instruction=query_instruction,
                   threshold=threshold, dim=dim, warmup_layer=warmup_layer, trigger_layer=trigger_layer,
                   max_pixels=max_pixels, receipt=receipt, vectors=vectors, keep=keep)

    @classmethod
    def for_collection(cls, collection: str | os.PathLike | None = None, model: str | os.PathLike | None = None, *,
                       revision: str | None = None, device: str = "auto", dtype: str = "auto",
                       batching: BatchingConfig | None = None, query_instruction: str | None = None,
                       reindex: bool = False, loading: Callable[[str], ContextManager[Any]] | None = None,
                       **settings: Any) -> "Retriever":
        """A retriever for `collection`, existing or not, with the model loaded when first needed.

        Every setting follows the defaults rule (see `CollectionProfile.resolve`): the
        collection's, else the one given (`model`, `revision`, and `settings`: r_max,
        warmup_layer, threshold, trigger_layer, dim, video, vectors, keep), else the documented default
        (`DEFAULT_MODEL`, r_max 0.5, ...). Raises CollectionError at once when a given setting
        differs from the existing collection's, ConfigError for an unknown or invalid setting.
        loading: see `ModelSpec.loading`.
        reindex: the collection is about to be rebuilt (`IndexOptions(reindex=True)`): given
            settings replace its own, the others are carried over (`CollectionProfile.carried_over`).
        """
        root = collection_path(collection)
        profile, chosen = collection_settings.for_collection(root, model, revision, reindex, settings)
        spec = ModelSpec(profile.model_id, profile.model_revision, device, dtype, batching, profile.serializer(),
                         loading)
        return cls(spec, collection=root, query_instruction=query_instruction, video=profile.video,
                   **{**{k: v for k, v in settings.items() if k != "video"}, **chosen})

    @classmethod
    def open(cls, collection: str | os.PathLike | None = None, *, device: str = "auto", dtype: str = "auto",
             batching: BatchingConfig | None = None, query_instruction: str | None = None) -> "Retriever":
        """A retriever for an existing collection, with its profile: the model, revision, pixel,
        video, FastE and dim settings of its manifest (the model loaded when first needed).
        Raises CollectionError when there is no collection."""
        root = collection_path(collection)
        read_profile(root)  # CollectionError naming the folder when it is not a collection
        return cls.for_collection(root, device=device, dtype=dtype, batching=batching,
                                  query_instruction=query_instruction)

    @property
    def embedder(self) -> Embedder:
        """The model, loaded now if it was not (with the collection's pixel and video settings,
        or the ones given to this retriever)."""
        if self._embedder is None:
            spec = self._spec
            if spec.serializer is None:
                settings = self._existing() or CollectionProfile.resolve(None, **self._given)
                spec = dataclasses.replace(spec, serializer=settings.serializer())
            self._embedder = spec.load()
        return self._embedder

    def _embedder_for(self, profile: CollectionProfile) -> Embedder:
        """The embedder serializing with `profile`'s pixel and video settings: the loaded one,
        or the same weights with the profile's serializer (`Embedder.with_serializer`)."""
        embedder = collection_settings.adapted_embedder(self.embedder, profile, self._adapted)
        if embedder is not self.embedder:
            self._adapted = embedder  # kept: the next call with these settings reuses it
        return embedder

    def _existing(self) -> CollectionProfile | None:
        """The collection's profile, None when it does not exist yet."""
        return existing_profile(self.collection)

    def close(self) -> None:
        with self._lock:
            if self._reader is not None:
                self._reader.close()
                self._reader = None
                self._reader_profile = None

    def __enter__(self) -> "Retriever":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- settings --------------------------------------------------------------------------
    @property
    def model_id(self) -> str:
        """The model this retriever embeds with (known without loading it)."""
        return self._embedder.model_id if self._embedder is not None else self._spec.name

    @property
    def r_max(self) -> float:
        """FastE's r_max for this retriever's documents: the collection's, else the one given,
        else the default (see `profile`; reading it loads no model)."""
        return (self._existing() or CollectionProfile.resolve(None, **self._given)).r_max

    def profile(self) -> CollectionProfile:
        """The settings this retriever embeds its collection's documents with: the existing
        collection's (CollectionError when a setting given to this retriever differs), else the
        given ones over the documented defaults, completed with the model (which this loads)."""
        existing = self._existing()
        return self._new_profile() if existing is None else self._checked(existing, self.collection)

    def _request(self) -> dict[str, Any]:
        """The settings given to this retriever, with its model's id (and revision, if known)."""
        if self._embedder is not None:
            model = {"model_id": self._embedder.model_id, "model_revision": self._embedder.loaded.revision}
        else:
            model = {"model_id": self._spec.name, "model_revision": self._spec.revision}
        return {**self._given, **model}

    def _checked(self, existing: CollectionProfile, root: Path) -> CollectionProfile:
        """`existing` after checking the given settings and the loaded model against it
        (`collection_settings.checked_profile`). Raises CollectionError naming what differs."""
        return checked_profile(existing, root, self._request(), self._embedder,
                               None if self._spec is None else self._spec.model_id)

    def _new_profile(self, carried: Mapping[str, Any] | None = None) -> CollectionProfile:
        """The profile of a new collection (`collection_settings.new_profile`; loads the model)."""
        return new_profile(self.embedder, self._request(), carried)

    def _model_source(self) -> ModelSource:
        """The model this retriever embeds with, as another process (a Ray worker) loads it."""
        return model_source(self._embedder, self._spec)

    def _writer(self) -> Collection:
        """The collection opened for writing (CollectionError at once if another writer holds it)."""
        self.close()
        return Collection.open(self.collection, writable=True)

    def _target(self, collection: str | os.PathLike | None) -> Path:
        if collection is not None:
            self.close()
            self.collection = collection_path(collection)
        return self.collection

    def _open_for_writing(self, root: Path, index_type: str) -> tuple[Collection, CollectionProfile]:
        """The collection to write into, and its profile (`collection_settings.open_for_writing`)."""
        return open_for_writing(root, index_type, existing_profile(root), lambda existing: self._checked(existing, root),
                                self._new_profile)

    def _erase_for_reindex(self, root: Path, index_type: str) -> tuple[Collection, CollectionProfile]:
        """Erase the collection for `index --reindex` and create it again with this retriever's
        settings (those not given are carried over, see `CollectionProfile.carried_over`), once
        nothing that follows can refuse: the model loads (re-indexing embeds everything anyway)
        before `collection_settings.recreate`. Raises ModelLoadError, ConfigError or
        CollectionError with the collection untouched."""
        existing = self._existing()
        profile = self._new_profile(None if existing is None else existing.carried_over(self._request()["model_id"]))
        return recreate(root, index_type, profile)

    # ---- indexing --------------------------------------------------------------------------
    def index(self, paths: Iterable[str | os.PathLike], collection: str | os.PathLike | None = None,
              options: IndexOptions | None = None,
              progress: Callable[[IndexProgress], None] | None = None,
              executor: IngestExecutor | None = None) -> IndexReport:
        """Bring a collection up to date with files and folders (images, videos, PDFs page by
        page, .txt/.md as text). Only new or changed files are embedded; files whose content
        matches a live item reuse its vectors; files gone from an indexed folder are removed.
        Work is committed every `options.chunk_files` files (a longer PDF every
        `options.chunk_pages` pages), so an interrupted run resumes where it stopped. Bad files
        are recorded as failures, never raised. An existing collection is indexed with its own
        settings (its profile); a new one with this retriever's.

        collection: where to index (and search from then on); None = the retriever's.
        executor: who embeds the plan (`IngestExecutor`); None = this process, chunk by chunk.
            `faste_mm.scale.RayExecutor(RayOptions("auto"))` (needs faste-mm[ray]) runs the same
            plan and commits with decoding and embedding spread over a Ray cluster.

        Raises CollectionError (settings differ from the collection, another writer holds it),
        ConfigError (bad options, index type or executor), InputError (no paths given).
        """
        options = options or IndexOptions()
        if options.index_type is not None:
            check_factory_syntax(options.index_type)  # before any model loads or anything is erased
        if executor is not None and not isinstance(executor, IngestExecutor):
            raise ConfigError(f"index: executor must have a run(job) method (an IngestExecutor such as "
                              f"faste_mm.scale.RayExecutor), got {executor!r}")
        executor = executor or LocalExecutor()
        started = time.perf_counter()
        root = self._target(collection)
        scan = scan_paths(paths, ScanFilter(options.exclude, options.include_hidden))
        self.close()
        if options.reindex:
            col, profile = self._erase_for_reindex(root, options.index_type or "auto")
        else:
            col, profile = self._open_for_writing(root, options.index_type or "auto")
        return index_collection(col, profile, scan, options, CollectionDocuments(self._embedder_for, col, profile),
                                self._model_source(), executor, progress, started)

    def pending(self, paths: Iterable[str | os.PathLike], options: IndexOptions | None = None) -> int:
        """How many files `index(paths, options=options)` would embed (or reuse) now: the new
        and changed ones (and, with retry_failed, those that failed); every file when the
        collection does not exist yet. Reads only (no model, no writer lock), so it can tell
        what an interrupted `index` still has to do."""
        options = options or IndexOptions()
        scan = scan_paths(paths, ScanFilter(options.exclude, options.include_hidden))
        if self._existing() is None:
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
        col, profile = self._open_for_writing(self.collection, "auto")
        report = add_documents(col, CollectionDocuments(self._embedder_for, col, profile), items, metadata, uris,
                               on_error)
        self.close()
        return report

    def delete(self, ids: Iterable[int]) -> int:
        """Tombstone items by id; returns how many were live."""
        with self._writer() as col:
            return col.delete(ids)

    def remove(self, paths: Iterable[str | os.PathLike] = (), ids: Iterable[int] = ()) -> RemoveReport:
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

    def export(self, path: str | os.PathLike) -> ExportReport:
        """Write the collection's live items and vectors to a Parquet file (a path or "parquet:FILE")
        or a LanceDB table ("lancedb:DIR/TABLE"; see `faste_mm.retrieval.export`)."""
        return export_collection(self.collection, os.fspath(path))

    # ---- search ----------------------------------------------------------------------------
    def search(self, query: str | None = None, *, image: str | os.PathLike | Image.Image | None = None,
               k: int = 10, instruction: str | None = None, where: Mapping[str, Any] | None = None,
               type: str | Sequence[str] | None = None, path: str | None = None,
               video: str | os.PathLike | None = None, mode: str = "dense", rescore: int | None = None,
               lexical_syntax: bool = False, rerank=None, rerank_top: int = 50) -> list[Hit]:
        """Top-k items for a text, an image, a video, or a combination. An image or a video alone
        is a query by example: it is embedded exactly like a document (so an indexed file finds
        itself with score ~1) unless `instruction` is given.

        rerank: a `faste_mm.Reranker`: the top `rerank_top` hits (at least k) are read back from
        their files and re-scored with the query; the best k come back ordered by it, each with
        `score` (cosine) and `rerank_score` (retrieval/rerank_hits.py).

        Filters (all must hold; k hits come back whenever k items match, whatever the index):
        where: metadata key -> value, e.g. {"tag": "invoice"} (values of `add(metadata=...)`);
        type: "image" | "pdf" | "text" | "video", or several; path: a glob on the stored path, e.g.
        "*/invoices/*" or "./photos/*" (see `faste_mm.indexers.SearchFilter`).
        mode: "dense" (by meaning), "lexical" (BM25 over the items' words, file names and metadata
        values; loads no model) or "hybrid" (both, fused by reciprocal rank); each Hit's `found_by`
        says which side found it. The query text is searched as plain words unless `lexical_syntax`.
        rescore: candidates per hit a quantized index returns for exact rescoring (None: the
        precision's default, 0: none; see README "Large collections").
        Raises InputError if nothing is given, ConfigError for a bad filter."""
        if query is None and image is None and video is None:
            raise InputError("search: give a query text, an image, a video, or a combination")
        image, video = (Path(value) if isinstance(value, os.PathLike) else value for value in (image, video))
        item = Item(text=query, image=image, video=video)
        options = dict(instruction=instruction, where=where, type=type, path=path, mode=mode, rescore=rescore,
                       lexical_syntax=lexical_syntax)
        if rerank is None:
            return self.search_batch([item], k=k, **options)[0]
        check_reranker(rerank, rerank_top)
        with self._lock:
            hits = self.search_batch([item], k=max(k, rerank_top), **options)[0]
            return rerank_hits(rerank, item, hits, k, self._open_reader().records([hit.id for hit in hits]))

    def search_batch(self, queries: Sequence[object], k: int = 10, instruction: str | None = None,
                     where: Mapping[str, Any] | None = None, type: str | Sequence[str] | None = None,
                     path: str | None = None, mode: str = "dense", rescore: int | None = None,
                     lexical_syntax: bool = False) -> list[list[Hit]]:
        """`search` for many queries (str text, Path/PIL image, or `Item`), one list of hits each;
        the filters and the mode apply to every query."""
        querying.check_mode(mode)
        search_filter = SearchFilter(where=where or {}, types=() if type is None else type, path=path)
        items = [querying.as_query(q, i) for i, q in enumerate(queries)]
        texts = querying.query_texts(items, mode)
        with self._lock:
            col = self._open_reader(check_model=mode != "lexical")
            vectors = None if mode == "lexical" else self._embed_queries(items, instruction)
            found = col.find(k, queries=vectors, texts=texts, mode=mode, where=search_filter, rescore=rescore,
                             lexical_syntax=lexical_syntax)  # hits and records of one snapshot
        return querying.hits(found)

    def _embed_queries(self, items: list[Item], instruction: str | None) -> np.ndarray:
        return querying.embed_queries(items, instruction, self._reader_profile.dim, self.encode_documents,
                                      self.encode_queries)

    # ---- encoding with the collection's settings -------------------------------------------
    def encode_queries(self, queries: Iterable[object], *, instruction: str | None = None,
                       on_error: OnError = "raise") -> EmbedResult:
        """Queries as `search` embeds them: the full forward with a task instruction
        (`instruction`, else the retriever's query_instruction, else DEFAULT_QUERY_INSTRUCTION
        for vision-language models and the model's default query task for text models)."""
        task = instruction or self.query_instruction
        if task is None and self.embedder.family.is_multimodal:
            task = DEFAULT_QUERY_INSTRUCTION
        # a Matryoshka collection's queries are truncated like its documents, sampled like them
        profile = self._reader_profile
        embedder = self.embedder if profile is None else self._embedder_for(profile)
        return embedder.encode_queries(queries, instruction=task, dim=None if profile is None else profile.dim,
                                       on_error=on_error)

    def encode_documents(self, documents: Iterable[object], *, on_error: OnError = "raise") -> EmbedResult:
        """Documents as `index` and `add` embed them into this collection: its model, pixel
        bounds and FastE settings, so the vectors compare with the stored ones. Raises
        CollectionError when the collection does not exist or the model differs from it."""
        with self._lock:
            self._open_reader()
            profile = self._reader_profile
        return self._embedder_for(profile).encode_documents(documents, fast_e=profile.fast_e(), dim=profile.dim,
                                                            on_error=on_error)

    def _open_reader(self, check_model: bool = True) -> Collection:
        """The collection opened for reading, once its profile is checked against this
        retriever's settings and model (which this loads; `check_model` False: a lexical search,
        which needs no model). Raises CollectionError."""
        if self._reader is None:
            self._reader = Collection.open(self.collection)
        if check_model and self._reader_profile is None:
            try:
                self.embedder  # noqa: B018  (loads the model: its width and pixels are checked)
                self._reader_profile = self._checked(CollectionProfile.from_manifest(self._reader.manifest),
                                                     self.collection)
            except BaseException:
                self._reader.close()
                self._reader = None
                raise
        return self._reader

    def encode_query(self, queries: object, *, instruction: str | None = None,
                     on_error: OnError = "raise") -> EmbedResult:
        """`encode_queries` under the sentence-transformers name; one input counts as a list of one."""
        return self.encode_queries(one_or_many(queries), instruction=instruction, on_error=on_error)

    def encode_document(self, documents: object, *, on_error: OnError = "raise") -> EmbedResult:
        """`encode_documents` under the sentence-transformers name; one input counts as a list of one."""
        return self.encode_documents(one_or_many(documents), on_error=on_error)


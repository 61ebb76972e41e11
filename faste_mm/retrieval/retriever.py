"""Retriever: the collection-level API. Composes the Embedder (documents with the collection's
FastE r_max, queries with the full forward and a query instruction) with a Collection on disk:
incremental, crash-safe indexing of files and folders, search by text or image, add and delete.

Receives paths, texts, images and queries; hands back the records of `faste_mm.retrieval.results`
(`IndexReport`, `AddReport`, `RemoveReport`, ranked `Hit`s).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from contextlib import nullcontext
from typing import Any, Callable, ContextManager, Iterable, Mapping, Sequence

import numpy as np
from PIL import Image

from faste_mm.errors import CollectionError, ConfigError, InputError
from faste_mm.indexers import Collection, CollectionInfo, SearchFilter
from faste_mm.indexers.faiss_index import check_factory_syntax, validate_factory
from faste_mm.indexers.manifest import settings_mismatch
from faste_mm.indexers.records import repeated_key
from faste_mm.indexers.quantization import check_choices
from faste_mm.indexers.search import MODES as SEARCH_MODES
from faste_mm.indexers.search import SOURCE_NAMES
from faste_mm.model.backbones.loading import check_local_path
from faste_mm.model.batching import BatchingConfig
from faste_mm.model.embedder import Embedder, EmbedResult, OnError, one_or_many
from faste_mm.model.items import Item, as_item
from faste_mm.model.runner import BatchTrace
from faste_mm.model.serialization import SerializerConfig
from faste_mm.model.video import VideoConfig
from faste_mm.retrieval import maintenance
from faste_mm.kinds import KINDS, kind_name
from faste_mm.retrieval.calibrations import load_calibration
from faste_mm.retrieval.decoders import query_item
from faste_mm.retrieval.documents import CollectionDocuments, add_record, refuse_repeated_rows
from faste_mm.retrieval.executors import IngestExecutor, IngestJob, LocalExecutor, ModelSource
from faste_mm.retrieval.export import ExportReport
from faste_mm.retrieval.export import export as export_collection
from faste_mm.retrieval.lexical import item_text
from faste_mm.retrieval.ingest import (IndexFailure, IngestTally, ScanFilter, failure_reasons, honour_exclusions,
                                       plan_update, record_missing, scan_paths)
from faste_mm.retrieval.maintenance import collection_path
from faste_mm.retrieval.receipt import PlanReceipt
from faste_mm.retrieval.profile import QUERY_INSTRUCTION, CollectionProfile, existing_profile, model_name, read_profile
from faste_mm.retrieval.results import AddReport, Hit, IndexOptions, IndexProgress, IndexReport, RemoveReport
from faste_mm.retrieval.rerank_hits import check_reranker, rerank_hits

log = logging.getLogger(__name__)

# One constant for every front end (search, serve, eval): see faste_mm.retrieval.profile.
DEFAULT_QUERY_INSTRUCTION = QUERY_INSTRUCTION
_FAST_E_NAMES = ("r_max", "warmup_layer", "threshold", "trigger_layer")


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """How to load the embedding model when it is first needed (see `Retriever.open`).

    model_id: hub id or local directory (str or path). revision: None = the hub's main, or
    the collection's when the retriever opens one. loading: a context manager factory the load
    runs in, given the model's name (the CLI shows a "loading" status with it)."""

    model_id: str | os.PathLike
    revision: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    batching: BatchingConfig | None = None
    serializer: SerializerConfig | None = None
    loading: Callable[[str], ContextManager[Any]] | None = None

    @property
    def name(self) -> str:
        """The model id the loaded Embedder reports: a local directory by its absolute path, so
        `Retriever.open` finds it again from any working directory; a hub id as given."""
        return model_name(self.model_id)

    def load(self) -> Embedder:
        with (self.loading or _no_status)(self.name):
            return Embedder.from_pretrained(self.name, device=self.device, dtype=self.dtype, revision=self.revision,
                                            batching=self.batching, serializer=self.serializer)


class Retriever:
    """Index files into a collection and search it.

    Example:
        >>> r = Retriever.from_pretrained("Qwen/Qwen3-VL-Embedding-2B", r_max=0.5)
        >>> r.index(["./images", "report.pdf"], collection="./my-collection")
        >>> r.search("a red bicycle", k=10)  # [Hit(id=.., score=.., uri=.., page=.., metadata=..)]

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
        existing = existing_profile(root)
        given = dict(settings)
        if model is not None:
            given.update(model_id=model, model_revision=revision)
        if reindex and existing is not None:
            given = {**existing.carried_over(model), **{k: v for k, v in given.items() if v is not None}}
            existing = None
        profile = _resolve(root, existing, given, model)
        spec = ModelSpec(profile.model_id, profile.model_revision, device, dtype, batching, profile.serializer(),
                         loading)
        chosen = {name: given.get(name) for name in ("r_max", "warmup_layer", "threshold", "trigger_layer", "dim",
                                                     "vectors", "keep")}
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
        embedder = self.embedder
        if not embedder.family.is_multimodal:
            return embedder
        wanted = profile.serializer(embedder.serializer.config)
        if wanted == embedder.serializer.config:
            return embedder
        if self._adapted is None or self._adapted.serializer.config != wanted:
            self._adapted = embedder.with_serializer(wanted)
        return self._adapted

    def _existing(self) -> CollectionProfile | None:
        """The collection's profile, None when it does not exist yet."""
        return existing_profile(self.collection)

    def close(self) -> None:
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
        """`existing` after checking the given settings against it, and the model once loaded
        (its width and pixel settings too). Raises CollectionError naming what differs."""
        profile = _resolve(root, existing, self._request(), None if self._spec is None else self._spec.model_id)
        if self._embedder is not None:
            errors = profile.conflicts(profile.as_loaded(self._embedder))  # pixels: see _embedder_for
            if errors:
                raise settings_mismatch(root, errors)
        return profile

    def _new_profile(self, carried: Mapping[str, Any] | None = None) -> CollectionProfile:
        """The profile of a new collection: the given settings over `carried` (a re-indexed
        collection's, see `CollectionProfile.carried_over`), over the loaded model's pixel and
        video settings, over the defaults; completed with the model (loaded now)."""
        embedder = self.embedder
        given = {name: value for name, value in self._request().items() if value is not None}
        loaded = {}
        if embedder.family.is_multimodal:
            config = embedder.serializer.config
            loaded = dict(min_pixels=config.min_pixels, max_pixels=config.max_pixels, video=config.video)
        settings = {**loaded, **(carried or {}), **given}
        if isinstance(given.get("video"), Mapping):  # some video fields given: over the others' video
            settings["video"] = dataclasses.replace({**loaded, **(carried or {})}.get("video", VideoConfig()),
                                                    **given["video"])
        profile = CollectionProfile.resolve(None, **settings)
        calibration = None
        if profile.r_max > 0 and profile.threshold is None:  # theta: the model's saved calibration, if any
            calibration = load_calibration(embedder.model_id, embedder.loaded.revision)
        return profile.completed(embedder, calibration)

    def _model_source(self) -> ModelSource:
        """The model this retriever embeds with, as another process (a Ray worker) loads it."""
        if self._embedder is not None:
            loaded = self._embedder
            return ModelSource(loaded.model_id, loaded.loaded.revision,
                               str(loaded.backbone.dtype).removeprefix("torch."), loaded.batching)
        return ModelSource(self._spec.name, self._spec.revision, self._spec.dtype, self._spec.batching)

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
        """The collection to write into, and its profile. A new one is created, which needs the
        model (its dim and revision go into the manifest); an existing one is opened without
        loading it, refusing at once given settings or a model id or revision that differ (the
        rest is checked when the model loads, see `CollectionDocuments`) and an index type FAISS
        cannot build (else found only after every file is embedded)."""
        existing = existing_profile(root)
        if existing is not None:
            profile = self._checked(existing, root)
            validate_factory(index_type, profile.dim)
            col = Collection.open(root, writable=True)
            return col, CollectionProfile.from_manifest(col.manifest)
        profile = self._new_profile()
        col = Collection.create(root, profile.to_manifest(index_type), exist_ok=True)
        return col, CollectionProfile.from_manifest(col.manifest)

    def _erase_for_reindex(self, root: Path, index_type: str) -> tuple[Collection, CollectionProfile]:
        """Erase the collection for `index --reindex` and create it again with this retriever's
        settings (those not given are carried over, see `CollectionProfile.carried_over`), once
        nothing that follows can refuse: the model loads (re-indexing embeds everything anyway),
        the index type must suit its dim, and the folder must hold nothing that would stop
        `Collection.create`. Raises ModelLoadError, ConfigError or CollectionError with the
        collection untouched."""
        existing = self._existing()
        profile = self._new_profile(None if existing is None else existing.carried_over(self._request()["model_id"]))
        validate_factory(index_type, profile.dim)
        Collection.erase(root, for_create=True)
        col = Collection.create(root, profile.to_manifest(index_type))
        return col, CollectionProfile.from_manifest(col.manifest)

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
        tally = IngestTally()
        if options.reindex:
            col, profile = self._erase_for_reindex(root, options.index_type or "auto")
        else:
            col, profile = self._open_for_writing(root, options.index_type or "auto")
        with col:
            scan = honour_exclusions(col, scan)  # paths removed earlier stay out of folder scans
            encode = CollectionDocuments(self._embedder_for, col, profile)
            plan = plan_update(col, scan, options.retry_failed)
            col.delete_uris(plan.vanished)
            if scan.missing:
                record_missing(col, scan.missing, tally)
            done = 0

            def report_progress(trace: BatchTrace | None = None) -> None:
                if progress is None:
                    return
                flight = encode.in_flight  # batches of the chunk being embedded, not yet in the tally
                chunk_size = min(options.chunk_files, len(plan.todo) - done)
                share = (done + chunk_size * min(1.0, flight.rows / flight.inputs) if flight.inputs else done)
                progress(IndexProgress(done, len(plan.todo), tally.embedded + flight.rows, tally.reused,
                                       len(tally.failures), tally.prefix_tokens + flight.prefix_tokens,
                                       tally.kept_prefix_tokens + flight.kept_prefix_tokens,
                                       time.perf_counter() - started,
                                       share / len(plan.todo) if plan.todo else 1.0,
                                       tally.tower_s + flight.tower_s, tally.decoder_s + flight.decoder_s))

            def files_committed(n: int) -> None:
                nonlocal done
                done = n
                report_progress()

            encode.on_batch = report_progress
            report_progress()
            executor.run(IngestJob(col, plan, profile, self._model_source(), encode, options.chunk_files, tally,
                                   files_committed, chunk_pages=options.chunk_pages))
            if options.index_type is not None and options.index_type != col.manifest.index_type:
                col.rebuild_index(options.index_type)
        factory = col.manifest.index_factory  # as saved by close(), which brought index.faiss up to date
        seconds = time.perf_counter() - started
        log.info("%s: embedded %d items, reused %d, %d files unchanged, %d removed, %d failed in %.1f s",
                 root, tally.embedded, tally.reused, plan.n_unchanged, len(plan.vanished), len(tally.failures), seconds)
        return IndexReport(str(root), len(scan.files()), tally.embedded, tally.reused, plan.n_unchanged,
                           len(plan.vanished),
                           len(tally.failures), tuple(tally.failures), tally.prefix_tokens,
                           tally.kept_prefix_tokens, seconds, factory, scan.n_excluded,
                           tower_s=tally.tower_s, decoder_s=tally.decoder_s)

    def pending(self, paths: Iterable[str | Path], options: IndexOptions | None = None) -> int:
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
        with col:
            result = CollectionDocuments(self._embedder_for, col, profile)(items, on_error)
            reasons = failure_reasons(result)
            if reasons and on_error == "raise":  # only non-finite vectors get here: encode raised the rest
                row = min(reasons)
                raise InputError(f"add: input {result.sources[row]}: {reasons[row]}",
                                 hint="or pass on_error='skip' to store the other items")
            records = [add_record(result.items[row], None if uris is None else uris[source],
                                   None if metadata is None else metadata[source], reasons.get(row))
                       for row, source in enumerate(result.sources)]
            refuse_repeated_rows(records, result.sources)  # before any write: all rows or none
            ok = np.array([row not in reasons for row in range(len(records))], dtype=bool)
            failed = [records[row] for row in sorted(reasons)]
            ids = np.full(len(records), -1, dtype=np.int64)
            # One transaction, as `index` commits a chunk: a crash keeps the rows and their
            # failure records together or neither.
            ids[ok] = col.commit(result.embeddings[ok], [r for r, is_ok in zip(records, ok) if is_ok], failed)[0]
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
        """Write the collection's live items and vectors to a Parquet file (a path or "parquet:FILE")
        or a LanceDB table ("lancedb:DIR/TABLE"; see `faste_mm.retrieval.export`)."""
        return export_collection(self.collection, str(path))

    # ---- search ----------------------------------------------------------------------------
    def search(self, query: str | None = None, *, image: str | Path | Image.Image | None = None,
               k: int = 10, instruction: str | None = None, where: Mapping[str, Any] | None = None,
               type: str | Sequence[str] | None = None, path: str | None = None,
               video: str | Path | None = None, mode: str = "dense", rescore: int | None = None,
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
        item = Item(text=query, image=image, video=video)
        options = dict(instruction=instruction, where=where, type=type, path=path, mode=mode, rescore=rescore,
                       lexical_syntax=lexical_syntax)
        if rerank is None:
            return self.search_batch([item], k=k, **options)[0]
        check_reranker(rerank, rerank_top)
        hits = self.search_batch([item], k=max(k, rerank_top), **options)[0]
        return rerank_hits(rerank, item, hits, k)

    def search_batch(self, queries: Sequence[object], k: int = 10, instruction: str | None = None,
                     where: Mapping[str, Any] | None = None, type: str | Sequence[str] | None = None,
                     path: str | None = None, mode: str = "dense", rescore: int | None = None,
                     lexical_syntax: bool = False) -> list[list[Hit]]:
        """`search` for many queries (str text, Path/PIL image, or `Item`), one list of hits each;
        the filters and the mode apply to every query."""
        if mode not in SEARCH_MODES:
            raise ConfigError(f"search mode must be one of {SEARCH_MODES}, got {mode!r}")
        search_filter = SearchFilter(where=where or {}, types=() if type is None else type, path=path)
        items = [_as_query(q, i) for i, q in enumerate(queries)]
        texts = None if mode == "dense" else [item.text or "" for item in items]
        if mode == "lexical" and not all(texts):
            raise InputError(f"search: lexical mode searches words; query {texts.index('') + 1} has no text "
                             f"(use --mode dense or hybrid for an image or video query)")
        col = self._open_reader(check_model=mode != "lexical")
        vectors = None if mode == "lexical" else self._embed_queries(items, instruction, col)
        found = col.find(k, queries=vectors, texts=texts, mode=mode, where=search_filter, rescore=rescore,
                         lexical_syntax=lexical_syntax)  # hits and records of one snapshot
        records = found.records
        return [[Hit(int(i), float(s), records[int(i)].uri, records[int(i)].page, records[int(i)].metadata,
                     SOURCE_NAMES[int(side)])
                 for s, i, side in zip(row_scores, row_ids, row_sides) if i >= 0]
                for row_scores, row_ids, row_sides in zip(found.scores, found.ids, found.sources)]

    def _embed_queries(self, items: list[Item], instruction: str | None, col: Collection) -> np.ndarray:
        by_example = [i for i, it in enumerate(items)
                      if instruction is None and it.instruction is None and not it.text
                      and (it.image is not None or it.video is not None)]
        with_task = [i for i in range(len(items)) if i not in set(by_example)]
        out = np.zeros((len(items), self._reader_profile.dim), dtype=np.float32)
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
        # a Matryoshka collection's queries are truncated like its documents, sampled like them
        profile = self._reader_profile
        embedder = self.embedder if profile is None else self._embedder_for(profile)
        return embedder.encode_queries(queries, instruction=task, dim=None if profile is None else profile.dim,
                                       on_error=on_error)

    def encode_documents(self, documents: Iterable[object], *, on_error: OnError = "raise") -> EmbedResult:
        """Documents as `index` and `add` embed them into this collection: its model, pixel
        bounds and FastE settings, so the vectors compare with the stored ones. Raises
        CollectionError when the collection does not exist or the model differs from it."""
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


def _as_query(value: object, position: int) -> Item:
    """A query: an `Item`, text, a PIL image, or a file made into a query by its kind's decoder
    (`decoders.query_item`: a text file by its text, a video, an image)."""
    if isinstance(value, Path) and kind_name(value) in KINDS and kind_name(value) != "pdf":
        return query_item(value, kind_name(value))
    item = as_item(value, position)
    if item.is_pdf and item.page is None:
        raise InputError(f"query {position}: {item.image} is a PDF; query with one page, "
                         f"Item(image=path, page=N)")
    return item


def _no_status(name: str) -> ContextManager[None]:
    return nullcontext()


def _resolve(root: Path, existing: CollectionProfile | None, given: Mapping[str, Any],
             model: str | os.PathLike | None) -> CollectionProfile:
    """`CollectionProfile.resolve` for the collection at `root`, its message naming the folder;
    a mistyped model path is reported as "not found", not as another model."""
    try:
        return CollectionProfile.resolve(existing, **given)
    except CollectionError as error:
        if model is not None:
            check_local_path(os.fspath(model))
        raise CollectionError(f"{root}: {error.message}", hint=error.hint, cli_hint=error.cli_hint) from None

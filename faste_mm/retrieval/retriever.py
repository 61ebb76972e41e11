"""Retriever: the collection-level API. Composes the Embedder (documents with the collection's
FastE r_max, queries with the full forward and a query instruction) with a Collection on disk:
incremental, crash-safe indexing of files and folders, search by text or image, add and delete.

Receives paths, texts, images and queries; hands back the records of `faste_mm.retrieval.results`
(`IndexReport`, `AddReport`, `RemoveReport`, ranked `Hit`s). The work is in the modules it
imports and the three collaborators it holds: collection_settings (`RetrieverSettings`: the
profile; `CheckedReader`: the collection open for searches), model_spec (`RetrieverModel`: the
model, loaded on first use), rerank_hits (`RerankerChoice`: which reranker), indexing + ingest +
scanning, documents (add), querying + search_executor (search).
"""
# Size: ~480 lines: the public facade, 37 methods (32 public) of a few lines each delegating to the
# modules and collaborators above; most of its lines are the API's docstrings.

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterable, Mapping, Sequence

import numpy as np

from faste_mm.errors import ConfigError, InputError
from faste_mm.indexers import Collection, CollectionInfo
from faste_mm.indexers.faiss_index import check_factory_syntax
from faste_mm.model.batching import BatchingConfig
from faste_mm.model.embedder import Embedder, EmbedResult, OnError
from faste_mm.model.items import Item
from faste_mm.model.patch_dedup import dedup_config
from faste_mm.retrieval import collection_settings, maintenance, querying
from faste_mm.retrieval.collection_settings import CheckedReader, RetrieverSettings
from faste_mm.retrieval.documents import add_documents
from faste_mm.retrieval.library.albums import Albums
from faste_mm.retrieval.library.duplicates import DEFAULT_THRESHOLD as DEFAULT_DUPLICATE_THRESHOLD
from faste_mm.retrieval.library.duplicates import DuplicateReport, collection_duplicates
from faste_mm.retrieval.executors import IngestExecutor, LocalExecutor
from faste_mm.retrieval.export import ExportReport
from faste_mm.retrieval.export import export as export_collection
from faste_mm.retrieval.indexing import index_collection
from faste_mm.retrieval.query_understanding import UnderstoodQuery
from faste_mm.retrieval.maintenance import collection_path
from faste_mm.retrieval.model_spec import ModelSpec, RetrieverModel
from faste_mm.retrieval.library.ocr import OcrEngine
from faste_mm.retrieval.ingest import ingest_work
from faste_mm.retrieval.profile import QUERY_INSTRUCTION, CollectionProfile, existing_profile, read_profile
from faste_mm.retrieval.setting import given_settings, keywords_of
from faste_mm.retrieval.rerank_hits import RerankerChoice
from faste_mm.retrieval.results import AddReport, Hit, IndexOptions, IndexProgress, IndexReport, RemoveReport
from faste_mm.retrieval.search_executor import PlannedQuery, SearchParts, execute, one, planned_query, understood
from faste_mm.retrieval.search_request import SearchRequest, options_for
from faste_mm.retrieval.scanning import Scan, ScannedFile, scan_paths

log = logging.getLogger(__name__)

# One constant for every front end (search, serve, eval): see faste_mm.retrieval.profile.
DEFAULT_QUERY_INSTRUCTION = QUERY_INSTRUCTION


class Retriever:
    """Index files into a collection and search it.

    Example:
        >>> r = Retriever.from_pretrained("Qwen/Qwen3-VL-Embedding-2B", r_max=0.5)
        >>> r.index(["./images", "report.pdf"], collection="./my-collection")
        >>> r.search("a red bicycle", k=5)  # [Hit(id=.., score=.., uri=.., page=.., metadata=..)]

    Safe to share across threads (a web app's workers): searches run one at a time.

    model: a loaded `Embedder`, or a `ModelSpec` loaded on first use (so info/remove/compact
        never load weights). query_instruction: None = DEFAULT_QUERY_INSTRUCTION for
        vision-language models, the model's own default query task for text models.
    settings: the collection settings, keywords named by `SETTINGS` (read from `CollectionProfile`'s
        declarations: r_max, warmup_layer, threshold, trigger_layer, dim, min_pixels, max_pixels,
        video, vectors, keep, reranker, receipt; docs/collections.md "Settings" explains each). Each
        follows the defaults rule: an existing collection's own value, else the one given here, else
        the documented default. A given value that differs from an existing collection's is refused
        (CollectionError naming it); an unknown keyword is a ConfigError listing the valid ones.
        video: a VideoConfig, or a mapping of some of its fields ({"fps": 2.0}).
        receipt: what `faste-mm plan` measured (`PlanReport.receipt(row)`), recorded by a NEW collection.
    """

    SETTINGS: tuple[str, ...] = keywords_of(CollectionProfile)
    SEARCH_OPTIONS: tuple[str, ...] = tuple(options_for("python"))  # search's keywords (`SearchRequest`)

    def __init__(self, model: Embedder | ModelSpec, *, collection: str | os.PathLike | None = None,
                 query_instruction: str | None = None, **settings: Any) -> None:
        given = given_settings(CollectionProfile, settings, "Retriever")
        CollectionProfile.resolve(None, **given)  # checks every value (ConfigError naming it) before any work
        self._setup(RetrieverSettings(RetrieverModel(model), given), collection_path(collection), query_instruction)

    def _setup(self, settings: RetrieverSettings, collection: Path, query_instruction: str | None) -> None:
        """The constructor's work, shared with `for_collection` (whose settings come with the
        profile it resolved, so an index run resolves its settings once)."""
        self._settings = settings  # the given settings, the model, the profiles resolved from them
        self.collection = collection
        self.query_instruction = query_instruction
        # One search at a time: threads (a web app's workers) share the reader (its SQLite
        # connection, FAISS index, caches) and the model; each uses all cores on its own anyway.
        self._lock = threading.RLock()
        self._reader = CheckedReader(settings)
        self._rerankers = RerankerChoice(lambda: settings.model.device)  # loaded when a search needs one
        self._ocr = OcrEngine()  # loads its models on the first image it reads

    @classmethod
    def from_pretrained(cls, model: str | os.PathLike, r_max: float | None = None, *,
                        collection: str | os.PathLike | None = None, device: str = "auto", dtype: str = "auto",
                        revision: str | None = None, batching: BatchingConfig | None = None,
                        query_instruction: str | None = None, **settings: Any) -> "Retriever":
        """Load `model` (hub id or local directory) now; `settings` as for `Retriever` (`SETTINGS`).
        Raises ModelLoadError, ConfigError for an unknown or invalid setting."""
        given = given_settings(CollectionProfile, {**settings, "r_max": r_max}, "Retriever.from_pretrained")
        CollectionProfile.resolve(None, **given)  # before the model loads
        spec = ModelSpec(model, revision, device, dtype, batching)
        return cls(spec.load(), collection=collection, query_instruction=query_instruction, **given)

    @classmethod
    def for_collection(cls, collection: str | os.PathLike | None = None, model: str | os.PathLike | None = None, *,
                       revision: str | None = None, device: str = "auto", dtype: str = "auto",
                       batching: BatchingConfig | None = None, query_instruction: str | None = None,
                       reindex: bool = False, loading: Callable[[str], ContextManager[Any]] | None = None,
                       **settings: Any) -> "Retriever":
        """A retriever for `collection`, existing or not, with the model loaded when first needed.

        Every setting follows the defaults rule (see `CollectionProfile.resolve`): the
        collection's, else the one given (`model`, `revision`, and `settings`, the keywords of
        `SETTINGS`), else the documented default (`DEFAULT_MODEL`, r_max 0.5, ...). The profile is
        resolved here once and kept for the run. Raises CollectionError at once when a given
        setting differs from the existing collection's, ConfigError for an unknown or invalid setting.
        loading: see `ModelSpec.loading`.
        reindex: the collection is about to be rebuilt (`IndexOptions(reindex=True)`): given
            settings replace its own, the others are carried over (`CollectionProfile.carried_over`).
        """
        root = collection_path(collection)
        given = given_settings(CollectionProfile, settings, "Retriever.for_collection")
        profile = collection_settings.for_collection(root, model, revision, reindex, given)
        spec = ModelSpec(profile.model_id, profile.model_revision, device, dtype, batching, profile.serializer(),
                         loading)
        retriever = cls.__new__(cls)
        retriever._setup(RetrieverSettings(RetrieverModel(spec), given, (root, reindex, profile)), root,
                         query_instruction)
        return retriever

    @classmethod
    def open(cls, collection: str | os.PathLike | None = None, *, device: str = "auto", dtype: str = "auto",
             batching: BatchingConfig | None = None, query_instruction: str | None = None,
             **settings: Any) -> "Retriever":
        """A retriever for an existing collection, with its profile: the model, revision, pixel,
        video, FastE, dim and reranker settings of its manifest (the model loaded when first
        needed). `settings` (`SETTINGS`) are checked against the collection's: one that differs
        is refused. Raises CollectionError when there is no collection."""
        root = collection_path(collection)
        read_profile(root)  # CollectionError naming the folder when it is not a collection
        return cls.for_collection(root, device=device, dtype=dtype, batching=batching,
                                  query_instruction=query_instruction, **settings)

    @property
    def embedder(self) -> Embedder:
        """The model, loaded now if it was not (with the collection's pixel and video settings,
        or the ones given to this retriever)."""
        return self._settings.embedder(self.collection)

    @property
    def loaded_embedder(self) -> Embedder | None:
        """The model if this process loaded it (its `describe_runtime`, `kernel_choices`); None when
        nothing was embedded here (a Ray run, nothing to embed): reading it loads nothing."""
        return self._settings.model.loaded

    def close(self) -> None:
        with self._lock:
            self._reader.close()

    def __enter__(self) -> "Retriever":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- settings (`collection_settings.RetrieverSettings` resolves them) -------------------
    @property
    def model_id(self) -> str:
        """The model this retriever embeds with (known without loading it)."""
        return self._settings.model.model_id

    @property
    def r_max(self) -> float:
        """FastE's r_max for this retriever's documents: the collection's, else the one given,
        else the default (see `profile`; reading it loads no model)."""
        return self._settings.current(self.collection).r_max

    def profile(self) -> CollectionProfile:
        """The settings this retriever embeds its collection's documents with: the existing
        collection's (CollectionError when a setting given to this retriever differs), else the
        given ones over the documented defaults, completed with the model (which this loads)."""
        return self._settings.profile(self.collection)

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
        ConfigError (bad options, index type or executor), InputError (no paths given, or a path
        that does not exist: a mistyped folder would otherwise leave an empty collection).
        """
        paths = list(paths)
        refuse_missing_paths(paths)
        options = options or IndexOptions()
        if options.index_type is not None:
            check_factory_syntax(options.index_type)  # before any model loads or anything is erased
        if executor is not None and not isinstance(executor, IngestExecutor):
            raise ConfigError(f"index: executor must have a run(job) method (an IngestExecutor such as "
                              f"faste_mm.scale.RayExecutor), got {executor!r}")
        started = time.perf_counter()
        if collection is not None:  # indexed there, and searched there from then on
            self.close()
            self.collection = collection_path(collection)
        scan = scan_paths(paths, options.scan_filter)
        return self.index_scan(scan, options, progress, executor, started=started)

    def index_scan(self, scan: Scan, options: IndexOptions | None = None,
                   progress: Callable[[IndexProgress], None] | None = None, executor: IngestExecutor | None = None,
                   ready: Callable[[ScannedFile], bool] | None = None, started: float | None = None) -> IndexReport:
        """`index` of a `Scan` already made (`scanning.scan_paths`): a folder watcher scans first
        to see whether anything changed. ready: which new or changed files to embed now (None: all;
        see `indexing.index_collection`). started: perf_counter() of the call (default now)."""
        options = options or IndexOptions()
        executor = executor or LocalExecutor()
        started = time.perf_counter() if started is None else started
        root = self.collection
        self.close()
        col, profile = self._settings.open_for_index(root, options.index_type or "auto", options.reindex)
        return index_collection(col, profile, scan, options, self._settings.documents(root, col, profile),
                                self._settings.model.source(), executor, progress, started, ready,
                                self._ocr if profile.ocr else None)

    def pending(self, paths: Iterable[str | os.PathLike], options: IndexOptions | None = None) -> int:
        """How many files `index(paths, options=options)` would embed (or reuse) now: the new
        and changed ones (and, with retry_failed, those that failed); every file when the
        collection does not exist yet. Reads only (no model, no writer lock), so it can tell
        what an interrupted `index` still has to do."""
        options = options or IndexOptions()
        scan = scan_paths(paths, options.scan_filter)
        if existing_profile(self.collection) is None:
            return len(scan.files())
        with Collection.open(self.collection) as col:
            return len(ingest_work(col, scan, options.retry_failed).todo)

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
        col, profile = self._settings.open_for_writing(self.collection, "auto")
        report = add_documents(col, self._settings.documents(self.collection, col, profile), items, metadata, uris,
                               on_error)
        self.close()
        return report

    def delete(self, ids: Iterable[int]) -> int:
        """Tombstone items by id; returns how many were live. CollectionError at once if another
        writer holds the collection."""
        self.close()
        with Collection.open(self.collection, writable=True) as col:
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

    def duplicates(self, threshold: float = DEFAULT_DUPLICATE_THRESHOLD, *, near: bool = True) -> DuplicateReport:
        """Groups of items that duplicate each other: exact copies (same content hash) and, with
        `near`, near-duplicates whose vectors score >= `threshold` (cosine in (0, 1]) by range search over
        the collection's index; largest group first, each with a suggested keeper (largest resolution,
        then earliest date). Loads no model and never deletes anything (`faste_mm.retrieval.library.duplicates`).
        Raises ConfigError for a threshold outside (0, 1], CollectionError when there is no collection."""
        return collection_duplicates(self.collection, threshold, near=near)

    def export(self, path: str | os.PathLike) -> ExportReport:
        """Write the collection's live items and vectors to a Parquet file (a path or "parquet:FILE")
        or a LanceDB table ("lancedb:DIR/TABLE"; see `faste_mm.retrieval.export`)."""
        return export_collection(self.collection, os.fspath(path))

    # ---- search ----------------------------------------------------------------------------
    def search(self, query: str | None = None, **options: Any) -> list[Hit]:
        """Top-k items for a text, an image, a video, or a combination; or, with `like`, for an
        indexed item ("more like this"). An image or a video alone is a query by example: it is
        embedded exactly like a document (so an indexed file finds itself with score ~1) unless
        `instruction` is given.

        options: the keywords of `SEARCH_OPTIONS`, each declared once in `SearchRequest`
        (faste_mm/retrieval/search_request.py; docs/search.md "Search options" lists them with
        their defaults): image, video, like, crop ((x, y, width, height) or "X,Y,W,H": search by that
        region of the image or of the `like` item's picture), instruction, k, mode ("dense" | "lexical" |
        "hybrid"), where (condition strings such as "taken>=2024-05-01", "place~lisbon",
        "country=Kenya", "tag=invoice", or a mapping key -> value read the same way), type, path,
        since, until, sort ("relevance" | "date" | "-date"), min_score (None: the collection's),
        rescore, lexical_syntax, rerank (None: the collection's reranker when it records one;
        False: none; True: the collection's, an error without one; a `faste_mm.Reranker`: that
        one), rerank_top (the hits the reranker re-scores, at least k), literal (False: the
        query text is read as meaning plus filters, `understand`; docs/asking.md).

        A query text longer than `search_request.MAX_QUERY_CHARS` characters is searched by its
        first `MAX_QUERY_CHARS` (logged), as every front end does.
        Raises InputError if nothing is asked, ConfigError for an unknown or invalid option
        (naming it and the valid range), CollectionError when there is no collection.

        Example:
            >>> r.search("a red bicycle", k=5, where=["place~lisbon"], since="2024-05", sort="-date")
        """
        return one(self.execute([SearchRequest.of("Retriever.search", query=query, **options)]))

    def albums(self) -> Albums:
        """The collection's albums, saved searches that stay current (`faste_mm.retrieval.library.albums`;
        docs/albums.md): `add` embeds an album's query with this retriever's model, as `search` does;
        every `index` run (and watch) then scores only its new and changed items for each album."""
        def plan(query: str, options: dict) -> PlannedQuery:
            request = SearchRequest.of("album", query=query, rerank=False, **options)
            with self._lock:
                return planned_query(request, self._search_parts())

        return Albums(self.collection, plan, lambda: read_profile(self.collection).min_score)

    def understand(self, query: str, *, literal: bool = False) -> UnderstoodQuery:
        """What `search(query)` reads from the text: the meaning text left for the model and the
        filters (dates, this collection's places, cameras, ratings, kinds, "quoted phrases"), each
        part with its span and label (`summary()` is the CLI's "understood: ..." line, `to_dict()`
        the `query.understood` object of the JSON answers). Loads no model.

        Example:
            >>> r.understand("beach in Lisbon last summer").summary()
            "understood: place Lisbon · taken 2024-06..2024-08 · 'beach'"
        """
        with self._lock:
            return understood(SearchRequest.of("Retriever.understand", query=query, literal=literal),
                              self._search_parts()).understood

    def more_like(self, like: int | str | os.PathLike, **options: Any) -> list[Hit]:
        """Items like an indexed one (an item id, or an indexed file's path: its first page), by
        its stored vector, the item itself left out: the page's "more like this" and `faste-mm
        search --like`. options: as `search` (filters, k, min_score, sort; no query, no rerank).
        Loads no model, unless `crop` ((x, y, width, height) in the picture's pixels) asks for a
        region of the item's image or PDF page: that region, read from its file, is embedded.
        Raises InputError naming an id or path that is not in the collection, or a bad crop."""
        return one(self.execute([SearchRequest.of("Retriever.more_like", like=like, **options)]))

    def search_batch(self, queries: Sequence[object], **options: Any) -> list[list[Hit]]:
        """`search` for many queries (str text, Path/PIL image, or `Item`), one list of hits each;
        `options` (those of `search`, without the query inputs) apply to every query."""
        items = [querying.as_query(q, i) for i, q in enumerate(queries)]
        requests = [SearchRequest.of("Retriever.search_batch", query=item.text, image=item.image, video=item.video,
                                     **options) for item in items]
        found = self.execute(requests, items)
        return [one([hits]) for hits in found]

    def execute(self, requests: Sequence[SearchRequest], items: Sequence[Item] | None = None, *,
                check_pairs: Callable[[int, int], None] | None = None) -> list[list[Hit] | Exception]:
        """Run search requests (`SearchRequest`) on this collection with the one executor
        (`search_executor.execute`), one batch at a time on this retriever: the hits of each, or
        its own error (`faste-mm serve` hands it each merged batch of its clients' requests).
        items: the query `Item`s (`search_batch`); check_pairs: a limit on a rerank's prompt
        tokens (`SearchParts.check_pairs`; the server's --max-request-tokens)."""
        with self._lock:
            return execute(requests, self._search_parts(check_pairs), items)

    def use_reranker(self, reranker: Any) -> None:
        """Rerank searches with this loaded `Reranker` wherever the collection's would be used
        (`rerank=None` on a collection that records one, `rerank=True`) instead of loading the
        collection's (`faste-mm serve --rerank`: one model, shared with /v1/rerank)."""
        self._rerankers.use(reranker)

    def _search_parts(self, check_pairs: Callable[[int, int], None] | None = None) -> SearchParts:
        """This retriever's collection, query model and reranker as the executor uses them."""
        def embed(items: list[Item], instruction: str | None) -> np.ndarray:
            return querying.embed_queries(items, instruction, self._reader.profile.dim, self.encode_documents,
                                          self.encode_queries)

        return SearchParts(reader=lambda check_model: self._reader.open(self.collection, check_model),
                           min_score=lambda: (self._reader.profile or read_profile(self.collection)).min_score,
                           embed=embed, reranker=self.search_reranker, check_pairs=check_pairs)

    def search_reranker(self, rerank: Any) -> Any:
        """The reranker of a search's `rerank`: itself (a Reranker), none for False, and for None
        the collection's when it records one, for True the collection's or an InputError (loaded
        on first use and kept; the one of `use_reranker` when given). See `RerankerChoice`."""
        return self._rerankers.choose(rerank, self.collection)

    # ---- encoding with the collection's settings -------------------------------------------
    def encode_queries(self, queries: Iterable[object], *, instruction: str | None = None,
                       on_error: OnError = "raise") -> EmbedResult:
        """Queries as `search` embeds them: the full forward with a task instruction
        (`instruction`, else the retriever's query_instruction, else `Embedder.encode_queries`'
        default: DEFAULT_QUERY_INSTRUCTION for vision-language models, the model's default query
        task for text models), so both embed a query alike."""
        task = instruction or self.query_instruction
        # a Matryoshka collection's queries are truncated like its documents, sampled like them
        profile = self._reader.profile
        embedder = self.embedder if profile is None else self._settings.embedder_for(profile, self.collection)
        return embedder.encode_queries(queries, instruction=task, dim=None if profile is None else profile.dim,
                                       on_error=on_error)

    def encode_documents(self, documents: Iterable[object], *, on_error: OnError = "raise") -> EmbedResult:
        """Documents as `index` and `add` embed them into this collection: its model, pixel
        bounds and FastE settings, so the vectors compare with the stored ones. Raises
        CollectionError when the collection does not exist or the model differs from it."""
        with self._lock:
            self._reader.open(self.collection)
            profile = self._reader.profile
        return self._settings.embedder_for(profile, self.collection).encode_documents(
            documents, fast_e=profile.fast_e(), dim=profile.dim, on_error=on_error,
            patch_dedup=dedup_config(profile.patch_dedup))

    def encode_query(self, queries: object, *, instruction: str | None = None,
                     on_error: OnError = "raise") -> EmbedResult:
        """`encode_queries` under the sentence-transformers name; one input counts as a list of one."""
        return self.encode_queries(queries, instruction=instruction, on_error=on_error)

    def encode_document(self, documents: object, *, on_error: OnError = "raise") -> EmbedResult:
        """`encode_documents` under the sentence-transformers name; one input counts as a list of one."""
        return self.encode_documents(documents, on_error=on_error)


def refuse_missing_paths(paths: Sequence[str | os.PathLike]) -> None:
    """InputError naming the given paths that do not exist, before anything is created or written
    (`Retriever.index` calls it; the CLI too, before the model loads). A link whose target is gone
    exists: it is recorded as a failure of the run, as a FIFO is."""
    missing = [str(p) for p in paths if not os.path.lexists(Path(p).expanduser())]
    if missing:
        names = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise InputError(f"{names}: no such file or folder; check the path (nothing was indexed; a file deleted "
                         f"since it was indexed leaves the collection with `remove`)")

"""The server's engine: one loaded `Embedder` (and, with a collection, a `Retriever`) behind the
dynamic batcher. HTTP handler threads call `embed` and `search`; they count prompt tokens and
check inputs in their own thread (so a bad input is refused before it can fail a merged batch),
then wait on the model thread, which runs `Embedder.encode` / `Retriever.search_batch` on
merged requests. Receives `Item`s from `serving.inputs`; hands back vectors (+ token usage) and `Hit`s.
"""
# Size: ~460 lines: the engine owns the model thread and every request kind it serves (embed, search, more
# like this, rerank); the request checks run in handler threads beside them.

from __future__ import annotations

import logging
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from faste_mm import Embedder, FastEConfig, Hit, InputError, Item, Retriever
from faste_mm.errors import CollectionError, ConfigError, FasteError
from faste_mm.indexers.search import check_query_text
from faste_mm.model.official import PIXELS_PER_VISUAL_TOKEN
from faste_mm.model.patch_dedup import dedup_config
from faste_mm.retrieval.profile import QUERY_INSTRUCTION, CollectionProfile, read_profile
from faste_mm.retrieval.search_executor import UnknownItemError
from faste_mm.retrieval.search_request import SearchRequest
from faste_mm.retrieval.library.watching import read_watch_status
from faste_mm.serving.batcher import Batcher, BatcherConfig, run_tasks
from faste_mm.serving.inputs import truncate_dimensions
from faste_mm.serving.mcp_paths import IndexRoots
from faste_mm.serving.metrics import BATCH_SIZE_BUCKETS, Metrics, describe_server_metrics
from faste_mm.serving.reindex_watch import ReindexWatch, ServedReads
from faste_mm.serving.security import LOOPBACK_HOSTS, check_allowed_hosts

log = logging.getLogger(__name__)

# A text is tokenized only up to this many characters per token of the model's max_length (it
# truncates on the right anyway): a few MB of text must not hold a handler thread for a minute.
# Text whose tokens are longer on average is tried again with 4x as many characters, so what
# the model sees never differs from the whole text's tokenization.
TEXT_CHARS_PER_TOKEN = 16


class RequestTooLargeError(FasteError):
    """A request over the token or body limit (HTTP 413)."""


class NoCollectionError(FasteError):
    """Search or thumbnails asked of a server started without a collection (HTTP 404)."""


class ModelStalledError(FasteError):
    """The model thread did not answer within `ServeConfig.model_wait_s` (HTTP 503: retry later)."""


class CollectionChangedError(CollectionError):
    """The served collection was re-indexed with another model than the one loaded (HTTP 409)."""


@dataclass(frozen=True, slots=True)
class ServeConfig:
    """Settings of one server process.

    api_key: Bearer token every data route requires (None: no authentication).
    batching: the dynamic batcher (token budget, max wait, queue bound).
    max_body_bytes: request bodies above this are refused (413). 16 MiB holds a large photo as a
        data: URL (base64) or the text of `max_request_tokens` tokens many times over.
    max_request_tokens: prompt tokens one request may carry (413 above).
    max_inputs: strings in one `input` list (OpenAI allows 2048).
    allow_remote_images: fetch http(s) image URLs (off: an open fetcher is an SSRF hole).
    fast_e: FastE for documents of an embeddings-only server (with a collection, its profile's
        settings are used); None = full forward, so vectors do not depend on how requests are merged.
    thumbnail_dir: where thumbnails are cached; None = beside the collection.
    allowed_hosts: the Host header names answered (others get 403: DNS rebinding); "*" = any.
        `security.host_names(bind_host, extra)` gives loopback + the bound address + extra.
    index_roots: folders under which the MCP `index` tool (/mcp) may read (--allow-index); none by default.
    model_wait_s: the longest a request waits for the model thread (queue + its batch) before it
        gets a 503: no handler thread waits forever, so a stalled model never takes every thread.
    """

    api_key: str | None = None
    batching: BatcherConfig = BatcherConfig()
    max_body_bytes: int = 16 << 20
    max_request_tokens: int = 65536
    max_inputs: int = 2048
    allow_remote_images: bool = False
    fast_e: FastEConfig | None = None
    thumbnail_dir: Path | None = None
    allowed_hosts: tuple[str, ...] = LOOPBACK_HOSTS
    index_roots: tuple[Path, ...] = ()
    model_wait_s: float = 600.0

    def __post_init__(self) -> None:
        if self.api_key is not None and not self.api_key.strip():
            raise ConfigError("ServeConfig.api_key is empty; give a real key or leave it unset")
        for name in ("max_body_bytes", "max_request_tokens", "max_inputs"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"ServeConfig.{name} must be an int >= 1, got {value!r}")
        if not isinstance(self.model_wait_s, (int, float)) or not self.model_wait_s > 0:
            raise ConfigError(f"ServeConfig.model_wait_s must be a number of seconds > 0, got {self.model_wait_s!r}")
        if self.fast_e is not None and not isinstance(self.fast_e, FastEConfig):
            raise ConfigError(f"ServeConfig.fast_e must be a FastEConfig or None, got {type(self.fast_e).__name__}")
        object.__setattr__(self, "allowed_hosts", check_allowed_hosts(self.allowed_hosts))
        object.__setattr__(self, "index_roots", IndexRoots.of(self.index_roots).roots)


@dataclass(frozen=True, slots=True)
class _EmbedPayload:
    items: list[Item]
    dimensions: int | None


@dataclass(frozen=True, slots=True)
class Embedded:
    """Vectors of one request: float32 [n, d] in input order, its prompt tokens, and which
    inputs were cut at the model's max_length (truncated[i] for input i)."""

    vectors: np.ndarray
    prompt_tokens: int
    truncated: tuple[bool, ...] = ()


@dataclass(frozen=True, slots=True)
class Measured:
    """A request's items as they will be embedded (long texts cut before tokenizing), their
    prompt tokens, and which items the model's max_length truncates."""

    items: list[Item]
    tokens: int
    truncated: tuple[bool, ...]


class ServeEngine:
    """Owns the model thread. Use as a context manager, or call `start()` / `close()`."""

    def __init__(self, embedder: Embedder, retriever: Retriever | None = None,
                 config: ServeConfig | None = None, metrics: Metrics | None = None, reranker=None) -> None:
        self.embedder = embedder
        self._loaded = embedder  # the weights as loaded (`embedder` follows a re-index's pixel settings)
        self.reranker = reranker  # a faste_mm.Reranker for /v1/rerank (serving.rerank), or None
        self.retriever = retriever
        if retriever is not None and reranker is not None:
            retriever.use_reranker(reranker)  # searches rerank with this loaded one, not a second copy
        self.config = config or ServeConfig()
        self.metrics = describe_server_metrics(metrics or Metrics())
        self.collection: Path | None = None if retriever is None else Path(retriever.collection)
        # The collection's profile: its documents were embedded with its FastE, new ones must match.
        self.profile: CollectionProfile | None = None if self.collection is None else read_profile(self.collection)
        self.document_fast_e = self.config.fast_e
        self.document_dedup = None  # duplicate-patch removal on documents: the collection's setting
        if self.profile is not None:
            self.document_fast_e = self.profile.fast_e()
            self.document_dedup = dedup_config(self.profile.patch_dedup)
        self._watch = None if self.collection is None else ReindexWatch(self.collection, embedder)
        # handler threads' reads of the collection (None: no collection)
        self._reads = None if self._watch is None else ServedReads(self._watch, self.follow_reindex)
        self._model_changed: str | None = None  # why searches are refused after a re-index with another model
        self._retriever_outdated = False  # the retriever still holds the old profile (reset on the model thread)
        self.query_instruction = self._default_query_instruction()
        runners = {"query": self._embed_runner("query"), "document": self._embed_runner("document")}
        if retriever is not None:
            runners["search"] = self._run_search
        if reranker is not None:
            runners["rerank"] = self._run_rerank
        runners["task"] = run_tasks  # other work on the model thread (the MCP index tool)
        self.batcher = Batcher(runners, self.config.batching, self.metrics)

    def _default_query_instruction(self) -> str | None:
        if self.retriever is not None and self.retriever.query_instruction is not None:
            return self.retriever.query_instruction
        prompt = getattr(self.embedder.serializer, "prompt", None)
        return prompt.default_query_instruction if prompt is not None else QUERY_INSTRUCTION

    def start(self) -> "ServeEngine":
        self.batcher.start()
        return self

    def close(self) -> None:
        self.batcher.close()

    def __enter__(self) -> "ServeEngine":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def follow_reindex(self) -> None:
        """Serve the collection's new settings when `index --reindex` re-created it
        (`serving.reindex_watch`): /info, the documents' FastE and pixels, and the query side
        (the retriever reads the new profile: dim, pixels). A collection now made with another
        model, revision or width is not searched with the loaded one: searches raise
        CollectionChangedError until the server is restarted. Called by each request first."""
        settings = None if self._watch is None else self._watch.changed()
        if settings is None:
            return
        self._model_changed = settings.model_changed
        if settings.model_changed is None:  # the same weights: pixels, video, FastE and dim follow
            self.embedder = settings.embedder
            self.document_fast_e = settings.profile.fast_e()
            self.document_dedup = dedup_config(settings.profile.patch_dedup)
        self.profile = settings.profile
        self._retriever_outdated = True
        log.info("%s was re-indexed; serving its new settings%s", self.collection,
                 "" if settings.model_changed is None else f" (searches refused: {settings.model_changed})")

    def wait(self, future):
        """The model thread's answer to one job, waited for at most `model_wait_s` (then 503)."""
        try:
            return future.result(timeout=self.config.model_wait_s)
        except FutureTimeout:
            future.cancel()  # still queued: never run it for a client that got its 503
            raise ModelStalledError(f"the model did not answer within {self.config.model_wait_s:g} s "
                                    f"(ServeConfig.model_wait_s); the server is overloaded or stalled, retry later") from None

    def _refuse_changed_model(self) -> None:
        if self._model_changed is not None:
            raise CollectionChangedError(
                f"the collection {self.collection} was re-indexed with another model ({self._model_changed}); "
                f"this server has {self._loaded.model_id} loaded, whose query vectors would not compare with the "
                f"stored ones; restart `faste-mm serve -c {self.collection}` to load the collection's model")

    # ---- embeddings (handler threads) --------------------------------------------------------
    def embed(self, items: list[Item], input_type: str | None = None, instruction: str | None = None,
              dimensions: int | None = None, truncate: bool = True) -> Embedded:
        """Embed one request's items. input_type "query": the query instruction (or the given
        one) and the full forward; "document" (the default): the document format (or the given
        instruction) and the server's FastE. Equals `Embedder.encode(items, fast_e=..,
        instruction=..)`, except that merged FastE batches may move a document's vector (see
        `serving.batcher`). truncate: an input longer than the model's max_length is cut there
        (reported in `Embedded.truncated`); False refuses it instead (413, TEI's `truncate`).
        Raises InputError (400), RequestTooLargeError (413), QueueFullError (503)."""
        self.follow_reindex()
        kind = input_type or "document"
        if kind not in ("query", "document"):
            raise InputError(f"input_type must be 'query' or 'document', got {input_type!r}")
        if len(items) > self.config.max_inputs:
            raise RequestTooLargeError(f"`input` has {len(items)} items; the limit is {self.config.max_inputs} "
                                       f"per request; split it")
        if dimensions is not None and not 1 <= dimensions <= self.embedder.dim:
            raise InputError(f"`dimensions` is {dimensions}, but this model's vectors have {self.embedder.dim}; "
                             f"give 1..{self.embedder.dim}")
        task = instruction if instruction is not None else (self.query_instruction if kind == "query" else None)
        measured = self.measure([replace(item, instruction=task) for item in items], "input")
        if not truncate and any(measured.truncated):
            index = measured.truncated.index(True)
            raise RequestTooLargeError(f"input[{index}] is longer than the model's {self.max_length} tokens and "
                                       f"`truncate` is false; shorten it, or send truncate: true to embed its "
                                       f"first {self.max_length} tokens")
        payload = _EmbedPayload(measured.items, dimensions)
        vectors = self.wait(self.batcher.submit(kind, payload, measured.tokens))
        return Embedded(vectors, measured.tokens, measured.truncated)

    @property
    def max_length(self) -> int:
        """The model's token limit per item (its serializer truncates on the right there)."""
        serializer = self.embedder.serializer
        return getattr(serializer, "max_length", None) or serializer.config.max_length

    def measure(self, items: list[Item], field: str) -> Measured:
        """The items serialized exactly as the model will see them (this also decodes and resizes
        images, so a bad one fails here, named), each text tokenized only up to
        `TEXT_CHARS_PER_TOKEN` characters per token the model can take. RequestTooLargeError
        over the per-request token limit."""
        total, cut, truncated = 0, [], []
        for index, item in enumerate(items):
            try:
                item, serialized = self._serialize_bounded(item)
            except FasteError as error:
                raise InputError(f"{field}[{index}]: {error}") from None
            except Exception as error:  # the processor's own errors: still this input's fault
                raise InputError(f"{field}[{index}]: cannot be serialized ({type(error).__name__}: {error})") from None
            total += serialized.length
            cut.append(item)
            truncated.append(bool(serialized.truncated))
        if total > self.config.max_request_tokens:
            raise RequestTooLargeError(f"the request has {total} prompt tokens; the limit is "
                                       f"{self.config.max_request_tokens} (--max-request-tokens); split it")
        return Measured(cut, total, tuple(truncated))

    def _serialize_bounded(self, item: Item):
        """(item, Serialized): a text longer than the model can use is cut before tokenizing, at
        a length whose tokens still reach max_length (so the model sees what the whole text gives)."""
        limit = TEXT_CHARS_PER_TOKEN * self.max_length
        while True:
            bounded = item if item.text is None or len(item.text) <= limit else replace(item, text=item.text[:limit])
            serialized = self.embedder.serializer(bounded, bounded.instruction)
            if bounded is item or serialized.truncated:
                return bounded, serialized
            limit *= 4  # long tokens (runs of symbols): the cut fell short of max_length

    def _embed_runner(self, kind: str):
        def run(payloads: list[_EmbedPayload]) -> list[object]:
            fast_e = self.document_fast_e if kind == "document" else None  # read per batch: a re-index changes it
            dedup = self.document_dedup if kind == "document" else None
            items = [item for payload in payloads for item in payload.items]
            result = self.embedder.encode(items, fast_e=fast_e, on_error="skip", patch_dedup=dedup)
            stats = result.stats
            self.metrics.observe("faste_mm_batch_items", len(items), BATCH_SIZE_BUCKETS, kind=kind)
            self.metrics.inc("faste_mm_tokens_in_total", stats.prefix_tokens + len(items), kind=kind)
            self.metrics.inc("faste_mm_prefix_tokens_total", stats.prefix_tokens, kind=kind)
            self.metrics.inc("faste_mm_prefix_tokens_kept_total", stats.kept_prefix_tokens, kind=kind)
            reasons = {failure.index: failure.reason for failure in result.failures}
            out: list[object] = []
            start = 0
            for payload in payloads:
                rows = range(start, start + len(payload.items))
                start += len(payload.items)
                bad = [row for row in rows if row in reasons]
                if bad:
                    out.append(InputError(f"input[{bad[0] - rows.start}]: {reasons[bad[0]]}"))
                    continue
                out.append(truncate_dimensions(result.embeddings[rows.start:rows.stop], payload.dimensions))
            return out

        return run

    # ---- search (handler threads) -------------------------------------------------------------
    def search(self, request: SearchRequest) -> list[Hit]:
        """The hits of one search request (text, a PIL image, both, or `like`: more like this), as
        `Retriever.search` gives them: the handler thread checks it and counts its prompt tokens
        (413 over the limit), the model thread runs it with the other clients' requests through
        the library's executor (`Retriever.execute`), reranked by default with the collection's
        reranker (this server's loaded one). Raises InputError (400), RequestTooLargeError (413),
        NoCollectionError (404), CollectionReindexingError / ModelStalledError (503)."""
        self._need_collection()
        self.follow_reindex()
        self._reads.refuse_reindexing()
        self._refuse_changed_model()
        request.checked_for("http")  # a server's bounds (k <= MAX_K), whichever front end asked
        check_query_text(request.query or "", nul=False)  # a lone surrogate: named, before any work
        tokens = 1  # lexical and more-like-this embed nothing: one slot of the batch
        if request.mode != "lexical" and not request.is_like:
            measured = self.measure([Item(text=request.query, image=request.image)], "query")
            tokens, text = measured.tokens, measured.items[0].text
            if text != request.query:  # cut where the model cuts: the model thread never tokenizes the rest
                request = replace(request, query=text)
        if request.crop is not None:  # cut on the model thread: counted as the most a picture may cost
            tokens = max(tokens, self.profile.max_pixels // PIXELS_PER_VISUAL_TOKEN)
        self.search_reranker(request)  # an impossible rerank (none loaded) is refused here, not in the batch
        return self.wait(self.batcher.submit("search", request, tokens))

    def search_reranker(self, request: SearchRequest):
        """The reranker `request` is reranked with here (None: not reranked), as the executor
        chooses it (`Retriever.search_reranker`); InputError when it asks for one this server lacks."""
        self._need_collection()
        if request.is_like and request.rerank is None:
            return None
        return self._reads.guarded(lambda: self.retriever.search_reranker(request.rerank))

    def understood(self, request: SearchRequest):
        """What `search(request)` read from its query text (`Retriever.understand`; None: no text,
        or more like this): the `query.understood` object of the HTTP and MCP answers."""
        self._need_collection()
        if request.query is None or request.is_like:
            return None
        return self._reads.guarded(lambda: self.retriever.understand(request.query, literal=request.literal))

    def _need_collection(self, what: str = "search") -> None:
        if self.retriever is None:
            raise NoCollectionError(f"this server has no collection; start it with `faste-mm serve -c NAME|DIR` "
                                    f"to {what}")

    def _run_search(self, requests: list[SearchRequest]) -> list[object]:
        if self._retriever_outdated:  # the retriever reads the re-created collection's profile afresh
            self._retriever_outdated = False
            self.retriever.close()
        # The collection erased or re-created under the open reader (its parts gone: it would say
        # "damaged") is opened afresh once; while it is still being re-created, each request gets
        # the 503 "being re-indexed" instead.
        for attempt in (1, 2):
            try:
                return self.retriever.execute(requests, check_pairs=self._check_pairs)
            except CollectionError:
                self.retriever.close()
                if self._watch.being_recreated():
                    return [self._reads.reindexing_error() for _ in requests]
                if attempt == 2:
                    raise
        raise AssertionError("unreachable: the second attempt returns or raises")

    def _check_pairs(self, tokens: int, hits: int) -> None:
        """RequestTooLargeError (413) when reranking a search's `hits` hits costs more prompt tokens
        than --max-request-tokens allows (as /v1/rerank's pairs do)."""
        if tokens > self.config.max_request_tokens:
            raise RequestTooLargeError(f"reranking {hits} hits (rerank_top) has {tokens} prompt tokens over its "
                                       f"pairs; the limit is {self.config.max_request_tokens} (--max-request-tokens); "
                                       f"lower rerank_top")

    def _run_rerank(self, payloads: list) -> list[object]:
        """One `Reranker.score` (or `explain`) per request, each with its own query, on the model
        thread; payloads: serving.rerank.RerankPayload / ExplainPayload."""
        out: list[object] = []
        for payload in payloads:
            try:
                out.append(payload.run(self.reranker))
            except Exception as error:  # noqa: BLE001 - one request's failure is that request's alone
                out.append(error)
        return out

    def record(self, item_id: int):
        """The live record of `item_id` (for thumbnails), read in the calling thread with that
        thread's own read-only connection. UnknownItemError if it is not a live item;
        CollectionReindexingError (503) while `index --reindex` re-creates the collection."""
        def read(col):
            if item_id not in col.live_ids([item_id]):
                raise UnknownItemError(f"id {item_id}: no such item in the collection")
            return col.get([item_id])[0]

        self._need_collection("read its items")
        return self._reads.on_thread_reader(read)

    def records(self, ids: list[int]) -> dict:
        """{id: ItemRecord} of those `ids` in the collection (a rerank reads their files back)."""
        self._need_collection("read its items")
        return self._reads.on_thread_reader(lambda col: col.records(ids))

    # ---- info ------------------------------------------------------------------------------
    def info(self) -> dict:
        """GET /info: model, dim, FastE, batching, and the collection's counts."""
        from faste_mm.retrieval.receipt import receipt_summary

        self.follow_reindex()
        collection = None
        if self.collection is not None:
            info = self._reads.guarded(lambda: _collection_info(self.collection))
            profile = self.profile
            collection = {"path": str(self.collection), "name": self.collection.name, "items": info.n_ok,
                          "failed": info.n_failed, "deleted": info.n_deleted, "index": info.index_factory,
                          "model": profile.model_id, "dim": profile.dim, "max_pixels": profile.max_pixels,
                          "r_max": profile.r_max, "reranker": profile.reranker,
                          "plan": receipt_summary(profile.receipt),
                          "searchable": self._model_changed is None,
                          "watch": read_watch_status(self.collection)}  # serve --watch or faste-mm watch
            if self._model_changed is not None:
                collection["refused"] = f"re-indexed with another model ({self._model_changed}); restart the server"
        fast_e = self.embedder.resolve_fast_e(self.document_fast_e)
        return {
            "model": self.embedder.model_id,
            "dim": self.embedder.dim,
            "device": str(self.embedder.backbone.device),
            "fast_e_documents": None if fast_e is None else fast_e.to_dict(),
            "query_instruction": self.query_instruction,
            "batching": {"batch_tokens": self.config.batching.batch_tokens,
                         "max_wait_ms": self.config.batching.max_wait_ms,
                         "max_queue": self.config.batching.max_queue},
            "limits": {"max_body_bytes": self.config.max_body_bytes,
                       "max_request_tokens": self.config.max_request_tokens,
                       "max_inputs": self.config.max_inputs},
            "auth": self.config.api_key is not None,
            "collection": collection,
            "reranker": None if self.reranker is None else self.reranker.settings(),  # the page's rerank toggle
        }


def _collection_info(root: Path):
    from faste_mm.indexers import Collection

    with Collection.open(root) as col:
        return col.info()

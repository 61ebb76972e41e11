"""What the MCP server's tools do, apart from the protocol: search, more_like_this, get_item,
explain, info and index over the same `ServeEngine` `faste-mm serve` runs (one model thread,
one search path), each a typed argument model in and a typed answer out.

Receives validated arguments (`SearchArgs`, ...); hands a `ToolAnswer` (structured result,
pictures, links to items) to `serving.mcp_server`, which speaks MCP. Nothing here opens a path
an argument names unless it is an indexed file of the collection or lies under a root the user
allowed with --allow-index; stored files are read back only through the paths serve uses
(`thumbnails`, `rerank.explain`).
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field

from faste_mm.errors import FasteError, InputError
from faste_mm.indexers.filters import INT64_MAX
from faste_mm.kinds import kind_name
from faste_mm.retrieval.search_request import MAX_MCP_K
from faste_mm.serving.inputs import request_model, to_request
from faste_mm.serving.mcp_paths import IndexRoots, query_image_file
from faste_mm.serving.thumbnails import has_thumbnail, jpeg, preview, thumbnail

log = logging.getLogger(__name__)

MAX_IMAGE_CHARS = 24 << 20  # an image as a data: URL (base64 of a large photo)
MAX_K = MAX_MCP_K  # the request's declared MCP limit (each hit carries a thumbnail)
MAX_TEXT_CHARS = 20_000  # get_item's text, cut beyond (text_truncated says so)
HIT_THUMBNAIL_PX = 160  # small: the assistant sees what it found without a large answer
PREVIEW_PX = 768  # get_item's larger look (a PDF page readable at this size)
ITEM_URI = "faste-mm://item/{id}"
ItemId = Field(ge=0, le=INT64_MAX, description="An item id, as search hits give it.")


# ---- arguments (their JSON Schemas are the tools' inputSchema) --------------------------------
class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


_THUMBNAILS = (bool, Field(True, description="Attach a small JPEG of each picture hit."))
# search's arguments are the request's options (faste_mm/retrieval/search_request.py), as MCP shows them; a
# long query is searched by its first search_request.MAX_QUERY_CHARS characters, as in every front end
SearchArgs = request_model("mcp", "SearchArgs", extra={"thumbnails": _THUMBNAILS}, limits={
    "path": {"max_length": 1000},
    "image": {"max_length": MAX_IMAGE_CHARS, "description": "Find by picture: the path of an indexed image file, or "
                                                            "a data: URL (data:image/png;base64,...)."}})
# more_like_this: an item id and the options that apply to it (no query, no words, no reranker)
MoreLikeThisArgs = request_model("mcp", "MoreLikeThisArgs", extra={"id": (int, ItemId), "thumbnails": _THUMBNAILS},
                                 leave_out=("query", "image", "like", "mode", "lexical_syntax", "rerank", "rerank_top"))


class GetItemArgs(_Args):
    id: int = ItemId
    preview: bool = Field(True, description=f"Attach a JPEG of the item (up to {PREVIEW_PX} px; a PDF page rendered).")


class ExplainArgs(_Args):
    # a long query is cut where the reranker cuts it (rerank.bounded_text), as POST /explain cuts it
    query: str = Field(..., min_length=1, description="The query the hit was found for.")
    id: int = ItemId
    layer: int | None = Field(None, ge=0, description="Decoder layer whose attention is shown (default: the last).")


class InfoArgs(_Args):
    pass


class IndexArgs(_Args):
    paths: list[str] = Field(..., min_length=1, max_length=100,
                             description="Files and folders to add or bring up to date (under an allowed root).")


# ---- answers (their JSON Schemas are the tools' outputSchema) --------------------------------
class HitOut(BaseModel):
    rank: int
    id: int
    score: float = Field(description="Cosine similarity (dense), -BM25 (lexical) or fused rank score (hybrid).")
    rerank_score: float | None = None
    similarity: float | None = Field(None, description="Hybrid search: the cosine similarity with the query "
                                                       "(the score is a fused rank score there).")
    uri: str = Field(description="The file's path (or the uri given when the item was added).")
    page: int | None = Field(None, description="1-based page of a PDF.")
    name: str
    kind: str
    found_by: str
    metadata: dict[str, Any] | None = None
    taken: str | None = Field(None, description="When the photo, video or document was taken or created, ISO 8601 "
                                                "with its recorded offset; null: undated (no date in the file).")
    facts: dict[str, Any] | None = Field(None, description="What the file says about itself: date taken, place, "
                                                           "camera, GPS, keywords, rating (as search --format json).")
    resource: str = Field(description="The item as an MCP resource (faste-mm://item/ID).")


class SearchOut(BaseModel):
    collection: str
    k: int
    mode: str
    reranked_by: str | None = None
    # the query text and what was read from it as filters (`UnderstoodQuery.to_dict()`; None: literal or no text)
    query: dict[str, Any] | None = None
    hits: list[HitOut]


class ItemOut(BaseModel):
    id: int
    uri: str
    page: int | None = None
    name: str
    kind: str
    modality: str
    metadata: dict[str, Any] | None = None
    size: int | None = None
    mtime: float | None = None
    text: str | None = Field(None, description=f"The item's words (text, PDF text layer), up to {MAX_TEXT_CHARS} characters.")
    text_truncated: bool = False
    resource: str


class ExplainOut(BaseModel):
    id: int
    uri: str
    page: int | None = None
    score: float = Field(description="The reranker's relevance score (0..1).")
    layer: int
    label: str
    query_share: float
    document_share: float
    template_share: float
    image_share: float = Field(description="Share of the attention on the item's picture (the heatmap).")
    text: list[dict[str, Any]] = Field(description="The item's text spans and their attention, most attended first.")


class InfoOut(BaseModel):
    collection: str
    model: str
    dim: int
    items: int
    failed: int
    deleted: int
    index: str | None = None
    settings: dict[str, Any]
    plan: str | None = Field(None, description="The measured fidelity and speed-up of the collection's settings.")
    reranker: str | None = None
    index_roots: list[str] = Field(description="Where the index tool may read (--allow-index); empty: nowhere.")


class IndexOut(BaseModel):
    report: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ToolAnswer:
    """A tool's result: the structured answer, a line for the assistant to read, JPEGs to show
    (the item shown, label, bytes) and the items to link to (id, name, file uri)."""

    result: BaseModel
    summary: str
    pictures: list[tuple[int, str, bytes]] = field(default_factory=list)
    links: list[tuple[int, str, str]] = field(default_factory=list)


Progress = Callable[[float, float | None, str | None], None]


class EngineSlot:
    """The one `ServeEngine` the tools use, made on first need by `load` (the model loads once)
    or given ready (inside `faste-mm serve`). A tool that needs it before it is ready waits on
    the lock; a failed load raises its error to that tool and is tried again by the next."""

    def __init__(self, load: Callable[[], Any] | None = None, engine=None) -> None:
        if (load is None) == (engine is None):
            raise ValueError("EngineSlot takes a loader or a ready engine")
        self._load, self._engine = load, engine
        self._lock = threading.Lock()

    def get(self):
        with self._lock:
            if self._engine is None:
                self._engine = self._load().start()
            return self._engine

    def warm_up(self) -> None:
        """Start loading in a background thread (failures are logged; a tool meets them again)."""

        def run() -> None:
            try:
                self.get()
            except FasteError as error:
                log.error("%s", error)
            except Exception:  # noqa: BLE001 - logged; the first tool that needs the model reports it
                log.exception("loading the model failed")

        threading.Thread(target=run, name="faste-mm-mcp-load", daemon=True).start()

    def close(self) -> None:
        with self._lock:
            if self._engine is not None and self._load is not None:
                self._engine.close()  # an engine given by serve is serve's to close


class McpTools:
    """The tools over one collection. `slot` gives the engine (model, batcher, reranker);
    `roots` says where `index` may read. Reads that need no model (get_item, info, resources)
    use a read-only connection of the calling thread."""

    def __init__(self, collection: Path, slot: EngineSlot, roots: IndexRoots) -> None:
        self.collection = Path(collection)
        self.slot = slot
        self.roots = roots
        self._local = threading.local()
        self._index_lock = threading.Lock()  # one writer at a time (the collection refuses a second anyway)

    def reader(self):
        from faste_mm.indexers import Collection

        col = getattr(self._local, "col", None)
        if col is None:
            col = self._local.col = Collection.open(self.collection)
        return col

    def record(self, item_id: int):
        """The live record of `item_id`; InputError naming it otherwise."""
        col = self.reader()
        if item_id not in col.live_ids([item_id]):
            raise InputError(f"id {item_id}: no such item in the collection {self.collection}; use an id from "
                             f"search results")
        return col.get([item_id])[0]

    # ---- tools -----------------------------------------------------------------------------
    def search(self, args: BaseModel, progress: Progress | None = None) -> ToolAnswer:
        """The search tool: the arguments made into a `SearchRequest` (every option of the request;
        `where` takes the CLI's --where words), run as serve runs it (the collection's reranker by
        default); hits carry their facts."""
        if not (args.query or "").strip() and args.image is None and args.like is None and args.id is None:
            raise InputError("search: give a `query` text, an `image` (an indexed file's path or a data: URL), "
                             "or both; or `like`: an item id (more like this)")
        image = None if args.image is None else query_image_file(args.image, self.reader(), self.roots)
        return self._run(args, image=image)

    def more_like_this(self, args: BaseModel, progress: Progress | None = None) -> ToolAnswer:
        self.record(args.id)  # an unknown id is refused before the model is waited for
        return self._run(args)

    def _run(self, args: BaseModel, **inputs: Any) -> ToolAnswer:
        values = {key: value for key, value in args.model_dump().items() if key not in ("thumbnails", "image")}
        request = to_request(values, "search", **inputs)
        engine = self.slot.get()
        reranker = engine.search_reranker(request)
        hits = engine.search(request)
        return self._hits_answer(hits, request.k, request.mode, args.thumbnails,
                                 None if reranker is None else reranker.model_id, engine.understood(request))

    def get_item(self, args: GetItemArgs, progress: Progress | None = None) -> ToolAnswer:
        record = self.record(args.id)
        text = self.reader().texts([record.id]).get(record.id)
        out = ItemOut(id=record.id, uri=record.uri, page=record.page, name=Path(record.uri).name,
                      kind=kind_name(record.uri), modality=record.modality, metadata=_plain(record.metadata),
                      size=record.size, mtime=record.mtime, text=None if text is None else text[:MAX_TEXT_CHARS],
                      text_truncated=text is not None and len(text) > MAX_TEXT_CHARS,
                      resource=ITEM_URI.format(id=record.id))
        pictures, note = [], ""
        if args.preview and has_thumbnail(record.uri, record.page):
            try:
                pictures.append((record.id, _label(record), preview(record, PREVIEW_PX)))
            except InputError as error:  # gone, or no longer the file indexed: the item without its picture
                note = f"; no picture: {error}"
        where = "" if record.page is None else f" page {record.page}"
        return ToolAnswer(out, f"item {record.id}: {record.uri}{where} ({out.kind}){note}", pictures,
                          [(record.id, out.name, record.uri)])

    def explain(self, args: ExplainArgs, progress: Progress | None = None) -> ToolAnswer:
        from faste_mm.serving.mcp_pictures import heatmap
        from faste_mm.serving.rerank import ExplainRequest, explain

        record = self.record(args.id)
        engine = _need_reranker(self.slot.get(), "explain")
        why = explain(engine, ExplainRequest(query=args.query, document_id=args.id, layer=args.layer))
        spans = sorted(why["text"], key=lambda span: -span["weight"])[:20]
        out = ExplainOut(id=record.id, uri=record.uri, page=record.page, score=why["score"], layer=why["layer"],
                         label=why["label"], query_share=why["query_share"], document_share=why["document_share"],
                         template_share=why["template_share"],
                         image_share=sum(image["total"] for image in why["images"]), text=spans)
        pictures = []
        if why["images"] and has_thumbnail(record.uri, record.page):
            pictures.append((record.id, f"heatmap of {_label(record)}", heatmap(record, why["images"][0], PREVIEW_PX)))
        return ToolAnswer(out, f"reranker score {out.score:.4f} for item {record.id} ({record.uri}); "
                               f"{out.image_share:.0%} of the readout's attention on its picture", pictures,
                          [(record.id, Path(record.uri).name, record.uri)])

    def info(self, args: InfoArgs | None = None, progress: Progress | None = None) -> ToolAnswer:
        from faste_mm.retrieval.profile import CollectionProfile
        from faste_mm.retrieval.receipt import receipt_summary

        col = self.reader()
        info, profile = col.info(), CollectionProfile.from_manifest(col.manifest)
        out = InfoOut(collection=str(self.collection), model=profile.model_id, dim=profile.dim, items=info.n_ok,
                      failed=info.n_failed, deleted=info.n_deleted, index=info.index_factory,
                      settings=profile.to_manifest(base=col.manifest).to_dict(), plan=receipt_summary(profile.receipt),
                      reranker=profile.reranker, index_roots=[str(root) for root in self.roots.roots])
        return ToolAnswer(out, f"{out.items} items in {out.collection}, embedded with {out.model} ({out.dim} dims)")

    def index(self, args: IndexArgs, progress: Progress | None = None) -> ToolAnswer:
        from faste_mm.retrieval.retriever import Retriever

        paths = [self.roots.check(path) for path in args.paths]  # all refused before anything is read
        engine = self.slot.get()
        updates: queue.SimpleQueue = queue.SimpleQueue()

        def report(state) -> None:  # on the model thread: handed to this thread, which may talk to the client
            updates.put((float(state.files_done), float(state.files_total),
                         f"{state.files_done}/{state.files_total} files, {state.embedded} embedded"))

        with self._index_lock:  # the model runs in one thread: the index run is queued like a search
            future = engine.batcher.submit("task", lambda: Retriever(engine.embedder, collection=self.collection)
                                           .index(paths, progress=report), 1)
            while True:
                try:
                    update = updates.get(timeout=0.1)
                except queue.Empty:
                    if future.done() and updates.empty():
                        break
                    continue
                if progress is not None:
                    progress(*update)
            done = future.result()
        return ToolAnswer(IndexOut(report=done.to_dict()),
                          f"indexed {done.files_scanned} files into {self.collection}: {done.embedded} embedded, "
                          f"{done.reused} reused, {done.unchanged} unchanged, {done.removed} removed, "
                          f"{done.failed} failed")

    # ---- pieces ----------------------------------------------------------------------------
    def _hits_answer(self, hits, k: int, mode: str, thumbnails: bool, reranked_by: str | None,
                     understood=None) -> ToolAnswer:
        cache = _thumbnail_dir(self.slot, self.collection)
        out, pictures, links = [], [], []
        for rank, hit in enumerate(hits[:k], 1):
            name = Path(hit.uri).name
            out.append(HitOut(rank=rank, id=hit.id, score=hit.score, rerank_score=hit.rerank_score,
                              similarity=hit.similarity, uri=hit.uri,
                              page=hit.page, name=name, kind=kind_name(hit.uri), found_by=hit.found_by,
                              metadata=_plain(hit.metadata), facts=None if hit.facts is None else hit.facts.to_dict(),
                              resource=ITEM_URI.format(id=hit.id),
                              taken=None if hit.facts is None else hit.facts.taken_iso()))
            links.append((hit.id, name, hit.uri))
            if thumbnails and has_thumbnail(hit.uri, hit.page):
                try:
                    small = jpeg(_open_jpeg(thumbnail(self.record(hit.id), cache)), HIT_THUMBNAIL_PX)
                    pictures.append((hit.id, f"{rank}. {_label_of(hit.id, hit.uri, hit.page)}", small))
                except InputError as error:  # gone, or not the file indexed: the hit stays, unpictured
                    log.warning("%s", error)
        query = None if understood is None else {"text": understood.query, "understood": understood.to_dict()}
        result = SearchOut(collection=str(self.collection), k=k, mode=mode, reranked_by=reranked_by, query=query,
                           hits=out)
        lines = [f"{h.rank}. {h.uri}{'' if h.page is None else f' (page {h.page})'}  score {h.score:.4f}  id {h.id}"
                 + (f"  {(h.taken or 'no date')[:10]}" if h.kind in ("image", "video") else "") for h in out]
        said = [understood.summary()] if understood is not None and understood.summary() else []
        return ToolAnswer(result, "\n".join([*said, f"{len(out)} results", *lines]), pictures, links)


def _need_reranker(engine, tool: str):
    if engine.reranker is None:
        raise InputError(f"{tool}: this server has no reranker; its user starts it with --rerank MODEL (faste-mm mcp "
                         f"or serve), or gives the collection one (faste-mm index --reranker MODEL)")
    return engine


def _thumbnail_dir(slot: EngineSlot, collection: Path) -> Path:
    from faste_mm.serving.thumbnails import default_cache_dir

    engine = slot._engine  # the served engine's --thumbnail-dir, when there is one already
    configured = None if engine is None else engine.config.thumbnail_dir
    return configured or default_cache_dir(collection)


def _open_jpeg(data: bytes):
    import io

    from PIL import Image

    return Image.open(io.BytesIO(data))


def _label(record) -> str:
    return _label_of(record.id, record.uri, record.page)


def _label_of(item_id: int, uri: str, page: int | None) -> str:
    return f"{Path(uri).name}{'' if page is None else f' page {page}'} (id {item_id})"


def _plain(metadata) -> dict[str, Any] | None:
    return None if metadata is None else dict(metadata)

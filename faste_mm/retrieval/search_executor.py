"""The one place a search runs: `SearchRequest`s -> ranked `Hit`s, for every front end (`Retriever`
calls it; `faste-mm serve` hands it each merged batch of its clients' requests; MCP, the page, the
thin client and the LangChain / LlamaIndex adapters only translate into requests).

In the order it happens: the query text understood as meaning and filters (`understood_search`;
not when `literal`; the request has already cut a long text to `MAX_QUERY_CHARS`), the query
embedded (text, image, video, both; an item id or indexed path for "more like this" reads its
stored vector; a `crop` cuts its region out of the query picture or the item's file, `query_crop`,
and that region is embedded instead), the filters, the
dense / lexical / hybrid search with its rescoring and minimum score, the reranker's second stage,
and the order; a query of filters only lists the matching items, newest first, embedding nothing.
Receives requests and the collection's parts (`SearchParts`); hands back one list
of hits (or the request's own error) per request.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from faste_mm.errors import CollectionError, ConfigError, FasteError, InputError
from faste_mm.indexers.filters import SearchFilter
from faste_mm.model.items import Item
from faste_mm.retrieval import querying, result_order
from faste_mm.retrieval.profile import CollectionProfile
from faste_mm.retrieval.query_crop import cropped, stored_picture
from faste_mm.retrieval.hits import Hit
from faste_mm.retrieval.rerank_hits import check_reranker, hit_item, rerank_hits
from faste_mm.retrieval.search_request import SearchRequest
from faste_mm.retrieval.query_understanding import UnderstoodQuery
from faste_mm.retrieval.understood_search import UnderstoodRequest, understood_request

log = logging.getLogger(__name__)

class UnknownItemError(InputError):
    """An item id or path that is not a live item of the collection (HTTP 404)."""


@dataclass(frozen=True, slots=True)
class SearchParts:
    """What the executor needs of a collection and its models (a `Retriever` hands its own).

    reader(check_model): the collection open for reading (check_model: its profile checked against
        the model, which loads it; False for a lexical search, which needs none).
    min_score(): the collection's default minimum score (None: keep every hit).
    embed(items, instruction): query vectors [q, dim] float32 in input order.
    reranker(rerank): the reranker of a request's `rerank` (None: the collection's, if it records
        one; False: none; True: the collection's, an error without one; a Reranker: itself).
    check_pairs(tokens, hits): raises when reranking `hits` hits costs too many prompt tokens (the
        server's --max-request-tokens); None = no limit (the library's).
    """

    reader: Callable[[bool], Any]
    min_score: Callable[[], float | None]
    embed: Callable[[list[Item], str | None], np.ndarray] | None = None
    reranker: Callable[[Any], Any] = lambda rerank: None
    check_pairs: Callable[[int, int], None] | None = None


def execute(requests: Sequence[SearchRequest], parts: SearchParts,
            items: Sequence[Item | None] | None = None) -> list[list[Hit] | FasteError]:
    """The hits of each request, best first (or its own FasteError: one bad request never fails
    the others of a merged batch). A CollectionError (the collection itself unreadable) is raised.
    items: the Python API's query `Item`s (a PDF page, an item's own instruction), one per request
    (None: made from the request's query, image and video)."""
    out: list[list[Hit] | FasteError | None] = [None] * len(requests)
    planned: list[tuple[int, _Plan]] = []
    for i, request in enumerate(requests):
        try:
            plan = _plan(understood(request, parts), parts, None if items is None else items[i])
        except (ConfigError, InputError) as error:
            out[i] = error
            continue
        if plan.is_listing:  # filters only: the matching items, newest first, nothing embedded
            out[i] = _finish(plan, querying.hits(parts.reader(False).newest(request.k, plan.where))[0], None, parts)
        else:
            planned.append((i, plan))
    # the model is checked (and loaded) only when a query is embedded: lexical and more-like-this need none
    col = parts.reader(any(plan.request.mode != "lexical" and plan.item is not None for _, plan in planned)) \
        if planned else None
    vectors = _embed_all([plan for _, plan in planned], parts)
    groups: dict[tuple, list[int]] = {}  # requests that search alike share one call
    for position, (_, plan) in enumerate(planned):
        groups.setdefault(plan.key, []).append(position)
    for members in groups.values():
        plans = [planned[p][1] for p in members]
        first = plans[0]
        rows = None if first.request.mode == "lexical" else np.stack([vectors[p] for p in members])
        found = col.find(first.fetch, queries=rows, texts=[plan.words for plan in plans] if first.words is not None
                         else None, mode=first.request.mode, where=first.where, rescore=first.request.rescore,
                         lexical_syntax=first.request.lexical_syntax, min_score=first.min_score)
        for p, plan, hits in zip(members, plans, querying.hits(found)):
            i = planned[p][0]
            try:
                out[i] = _finish(plan, hits, col, parts)
            except CollectionError:
                raise
            except FasteError as error:  # its own (a bad hit file, too many rerank tokens): the others go on
                out[i] = error
    return out


def understood(request: SearchRequest, parts: SearchParts) -> UnderstoodRequest:
    """`request` as it is searched: its query text understood against today's date and the
    collection's places (read once per version of the collection), unless `literal`."""
    asks_places = request.query is not None and not request.literal and not request.is_like
    return understood_request(request, parts.reader(False).read(lambda rows: rows.places()) if asks_places else [])


@dataclass(frozen=True, slots=True)
class _Plan:
    """One request made concrete: its query item (None for more-like-this, which searches with the
    item's stored vector; a region of it with `crop`), the item id it is like (left out of its
    hits), its words, filter, minimum score, depth and reranker."""

    request: SearchRequest
    item: Item | None
    like_id: int | None
    words: str | None
    where: SearchFilter
    min_score: float | None
    fetch: int
    reranker: Any
    is_listing: bool = False

    @property
    def key(self) -> tuple:
        """Requests with one key run as one `Collection.find` (the same filter, mode and depth)."""
        where, request = self.where, self.request
        return (tuple(sorted(where.where.items(), key=repr)), where.types, where.path, where.facts, where.phrases,
                request.mode, request.rescore, request.lexical_syntax, self.min_score, self.fetch, self.like_id is not None)


def _plan(asked: UnderstoodRequest, parts: SearchParts, item: Item | None = None) -> _Plan:
    """The request checked and made concrete (InputError / ConfigError naming the bad option)."""
    request = asked.request
    where = result_order.search_filter(request.where, request.type, request.path, request.since, request.until)
    if asked.phrases:
        where = replace(where, phrases=where.phrases + asked.phrases)
    if asked.is_listing:
        return _Plan(request, None, None, None, where, None, request.k, None, is_listing=True)
    min_score = request.min_score
    result_order.check_min_score_mode(min_score, request.mode)
    if min_score is None and request.mode != "lexical":
        min_score = parts.min_score()
    if request.is_like:
        if request.rerank is True or (request.rerank not in (None, False)):
            raise InputError("search: rerank re-scores hits against a query text or image; it does not apply to "
                             "`like` (more like this)")
        if request.mode != "dense":
            raise InputError(f"search: `like` (more like this) searches by the item's vector; mode "
                             f"{request.mode} does not apply")
        like_id = _like_id(request.like, parts)
        item = None if request.crop is None else \
            cropped(stored_picture(parts.reader(False).get([like_id])[0]), request.crop, _max_pixels(parts))
        return _Plan(request, item, like_id, None, where, min_score, request.k + 1, None)
    read = asked.understood is not None and bool(asked.understood.parts)
    text = (request.query or None) if read else request.query  # the meaning text ("" beside an image: none)
    if item is not None and item.text is not None and item.text != text:  # the meaning left, or the cut text
        item = replace(item, text=text)
    if item is None:
        image, video = (Path(v) if isinstance(v, os.PathLike) else v for v in (request.image, request.video))
        item = Item(text=text, image=image, video=video)
    if request.crop is not None:
        item = cropped(item, request.crop, _max_pixels(parts))
    reranker = parts.reranker(request.rerank)
    fetch = request.k
    if reranker is not None:
        check_reranker(reranker, request.rerank_top)
        fetch = max(request.k, request.rerank_top)
    words = querying.query_texts([item], request.mode)
    return _Plan(request, item, None, None if words is None else words[0], where, min_score, fetch, reranker)


def _like_id(like: Any, parts: SearchParts) -> int:
    """The item a more-like-this request names: an id, or an indexed file's path (its first page).
    InputError naming it when it is not a live item of the collection."""
    col = parts.reader(False)
    if isinstance(like, int) or (isinstance(like, str) and like.isascii() and like.isdigit()):
        item_id = int(like)
        if not 0 <= item_id < 2**63 or item_id not in col.live_ids([item_id]):
            raise UnknownItemError(f"id {item_id}: no such item in the collection; use an id from search results")
        return item_id
    path = Path(os.fspath(like)).expanduser()
    uri = str(path.resolve()) if not path.is_absolute() or path.exists() else str(path)
    ids = col.read(lambda rows: rows.live_ids_of(uri))
    if not ids:
        raise UnknownItemError(f"like {os.fspath(like)!r}: not an indexed file of the collection; index it first, or "
                         f"give an item id from search results")
    return ids[0]


def _max_pixels(parts: SearchParts) -> int:
    """The collection's image budget: a PDF page is cut from its rendering at it, as it was indexed."""
    return CollectionProfile.from_manifest(parts.reader(False).manifest).max_pixels


def _embed_all(plans: list[_Plan], parts: SearchParts) -> list[np.ndarray | None]:
    """Each plan's query vector (None for lexical mode), the query items embedded together per
    instruction; a more-like-this request's vector is its item's stored one (without a crop)."""
    vectors: list[np.ndarray | None] = [None] * len(plans)
    by_instruction: dict[str | None, list[int]] = {}
    for p, plan in enumerate(plans):
        if plan.item is None:
            vectors[p] = parts.reader(False).vectors([plan.like_id])[0]
        elif plan.request.mode != "lexical":
            by_instruction.setdefault(plan.request.instruction, []).append(p)
    for instruction, members in by_instruction.items():
        if parts.embed is None:
            raise ConfigError("search: this searcher embeds no queries; only mode lexical runs here")
        rows = parts.embed([plans[p].item for p in members], instruction)
        for p, row in zip(members, rows):
            vectors[p] = row
    return vectors


def _finish(plan: _Plan, hits: list[Hit], col, parts: SearchParts) -> list[Hit]:
    """A request's hits past the search: the item itself left out of its own more-like-this,
    reranked, the best k, in the request's order."""
    request = plan.request
    if plan.like_id is not None:
        hits = [hit for hit in hits if hit.id != plan.like_id]
    elif plan.reranker is not None:
        records = col.records([hit.id for hit in hits])
        read = _counted(plan, hits, records, parts)
        hits = rerank_hits(plan.reranker, plan.item, hits, request.k, records, read)
    return result_order.sort_hits(hits[:request.k], request.sort)


def _counted(plan: _Plan, hits: list[Hit], records, parts: SearchParts) -> dict[int, Item] | None:
    """With a pair-token limit (the server's): the hits read back once and their pairs' prompt
    tokens counted against it before the reranker runs (`Reranker.pair_tokens` reads an image's
    header or a page's box, nothing rendered); a hit that cannot be read again counts nothing."""
    if parts.check_pairs is None:
        return None
    reranker = plan.reranker
    try:
        prepared = reranker.prepare_query(plan.item)
    except FasteError as error:
        raise InputError(str(error)) from None
    total, read = 0, {}
    for hit in hits:
        try:
            document = hit_item(hit, records)
            total += reranker.pair_tokens(prepared, document)
        except Exception:  # noqa: BLE001 - unreadable now: rerank_hits reports it and keeps the hit unscored
            continue
        read[hit.id] = document
    parts.check_pairs(total, len(hits))
    return read


def search_words(collection: str | os.PathLike, request: SearchRequest) -> list[Hit]:
    """A lexical search without a reranker on the collection at `collection`: no model, no torch
    (`faste-mm search --mode lexical` answers from here as quickly as the thin client). Raises the
    request's error, CollectionError when there is no collection."""
    from faste_mm.indexers import Collection

    from faste_mm.retrieval.profile import read_profile

    if request.mode != "lexical" or (request.rerank is not False and read_profile(collection).reranker is not None) \
            or request.rerank not in (None, False):
        raise ConfigError("search_words runs lexical searches that rerank nothing (mode 'lexical'; rerank False, "
                          "or None on a collection without a reranker)")
    with Collection.open(collection) as col:
        found = execute([request], SearchParts(reader=lambda check_model: col, min_score=lambda: None))[0]
    if isinstance(found, FasteError):
        raise found
    return found


def understood_in(collection: str | os.PathLike, request: SearchRequest) -> UnderstoodQuery | None:
    """What a search of `request` on the collection at `collection` reads from its query text
    (None: no text, or more like this), without a model: the CLI shows it whoever answered."""
    from faste_mm.indexers import Collection

    with Collection.open(collection) as col:
        return understood(request, SearchParts(reader=lambda check_model: col, min_score=lambda: None)).understood


def one(found: list[list[Hit] | Exception]) -> list[Hit]:
    """The hits of a one-request answer, or its error raised."""
    if isinstance(found[0], Exception):
        raise found[0]
    return found[0]


@dataclass(frozen=True, slots=True)
class PlannedQuery:
    """What a dense search of a request searches with, made once and kept (an album keeps it): the
    filter (the request's joined with those read from its text), the text the model embedded, the
    query vector [dim] float32 and what was understood (None: nothing)."""

    where: SearchFilter
    meaning: str | None
    vector: np.ndarray
    understood: UnderstoodQuery | None


def planned_query(request: SearchRequest, parts: SearchParts) -> PlannedQuery:
    """`request` understood, planned and its query embedded as `execute` does, without searching.
    InputError / ConfigError as `execute` words them; InputError for a request of filters only
    (nothing left to embed) or one that is not a dense search of a query."""
    asked = understood(request, parts)
    if request.mode != "dense" or request.is_like:
        raise InputError("a planned query is a dense search of a query text or picture (mode dense, no `like`)")
    plan = _plan(asked, parts)
    if plan.is_listing:
        summary = asked.understood.summary() if asked.understood is not None else ""
        raise InputError(f"{request.query!r}: only filters were read from it ({summary}), no words to rank by; "
                         f"add what to look for, or search it as typed (literal)")
    parts.reader(True)  # the collection's profile checked against the model, which this loads
    vector = _embed_all([plan], parts)[0]
    return PlannedQuery(plan.where, plan.item.text if plan.item is not None else None, vector, asked.understood)

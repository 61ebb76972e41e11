"""POST /v1/rerank (and /rerank) in the convention vLLM, Jina and Cohere share, and POST /explain.

Request: `query` and each of `documents` is a string, a list of content parts (`text`,
`image_url`), or an object (`{"text": ..., "image": url}` as Jina, `{"content": [parts]}` as
vLLM); `top_n`, `return_documents`, `instruction`. Response: `results` best first, each with
`index` (position in `documents`) and `relevance_score` (the reranker's sigmoid score), plus
`document` when asked; `failures` lists candidates that could not be scored. Handler threads
parse, decode and count tokens; the engine's model thread runs `Reranker.score`.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from typing import Any, Union

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from faste_mm import InputError, Item
from faste_mm.errors import FasteError
from faste_mm.retrieval.search_request import DEFAULTS
from faste_mm.retrieval.stored_files import stored_item
from faste_mm.serving.engine import TEXT_CHARS_PER_TOKEN, RequestTooLargeError, ServeEngine
from faste_mm.serving.inputs import ContentPart, decode_image_url, parts_item

Multimodal = Union[str, list[ContentPart], dict[str, Any]]


class RerankRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    query: Multimodal
    documents: list[Multimodal]
    model: str | None = None
    top_n: int | None = Field(default=None, ge=0)
    return_documents: bool = False
    instruction: str | None = None


class ExplainRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    query: Multimodal
    document: Multimodal | None = None
    document_id: int | None = Field(default=None, ge=0, le=2**63 - 1)  # an item of the served collection
    model: str | None = None
    instruction: str | None = None
    layer: int | None = Field(default=None, ge=0)


@dataclass(frozen=True, slots=True)
class RerankPayload:
    """One /v1/rerank request for the model thread (`ServeEngine._run_rerank` calls `run`)."""

    query: Item
    documents: list[Item]
    instruction: str | None

    def run(self, reranker):
        return reranker.score(self.query, self.documents, instruction=self.instruction)


@dataclass(frozen=True, slots=True)
class ExplainPayload:
    """One /explain request for the model thread."""

    query: Item
    document: Item
    instruction: str | None
    layer: int | None

    def run(self, reranker):
        return reranker.explain(self.query, self.document, instruction=self.instruction, layer=self.layer)


def with_search_top(info: dict) -> dict:
    """/info with the reranker's `search_top`: how many hits a reranked /search without its own
    `rerank_top` re-scores (the page's toggle says it; the request's declared default)."""
    if info.get("reranker") is None:
        return info
    return {**info, "reranker": {**info["reranker"], "search_top": DEFAULTS["rerank_top"]}}


def request_item(value: Multimodal, where: str, allow_remote: bool) -> Item:
    """One query or document of a rerank request as an `Item` (text and at most one image);
    InputError naming the field."""
    if isinstance(value, str):
        return Item(text=value)
    if isinstance(value, dict):
        if "content" in value and set(value) <= {"content"}:  # vLLM {"content": [parts]}
            parts = value["content"]
            if not isinstance(parts, list):
                raise InputError(f"{where}.content must be a list of parts")
            return parts_item([_part(p, f"{where}.content[{i}]") for i, p in enumerate(parts)], f"{where}.content", allow_remote)
        unknown = set(value) - {"text", "image"}
        if unknown:
            raise InputError(f"{where}: unknown fields {sorted(unknown)}; an object has `text` and/or `image` (a data: URL)")
        text, image = value.get("text"), value.get("image")
        if text is not None and not isinstance(text, str) or image is not None and not isinstance(image, str):
            raise InputError(f"{where}: `text` and `image` must be strings")
        return Item(text=text, image=None if image is None else decode_image_url(image, f"{where}.image", allow_remote))
    return parts_item(value, where, allow_remote)


def _part(raw, where: str) -> ContentPart:
    try:
        return ContentPart.model_validate(raw)
    except Exception as error:  # noqa: BLE001 - pydantic's message, named
        raise InputError(f"{where}: not a content part ({error})") from None


def rerank(engine: ServeEngine, body: RerankRequest) -> dict:
    """Handler side of POST /v1/rerank: parse, count pair tokens against the limits, wait for the
    model thread's `Reranker.score`, render best first. Equals `Reranker.score` on the same items."""
    reranker = _reranker(engine, body.model)
    allow = engine.config.allow_remote_images
    if len(body.documents) > engine.config.max_inputs:
        raise RequestTooLargeError(f"`documents` has {len(body.documents)} entries; the limit is "
                                   f"{engine.config.max_inputs} per request; split it")
    query = bounded_text(reranker, request_item(body.query, "query", allow))
    documents = [bounded_text(reranker, request_item(d, f"documents[{i}]", allow)) for i, d in enumerate(body.documents)]
    tokens = _count_pair_tokens(engine, reranker, query, documents, body.instruction)
    result = engine.wait(engine.batcher.submit("rerank", RerankPayload(query, documents, body.instruction), tokens))
    results = []
    for ranked in result.ranked(body.top_n):
        entry = {"index": ranked.index, "relevance_score": ranked.score}
        if body.return_documents:
            raw = body.documents[ranked.index]
            entry["document"] = {"text": raw} if isinstance(raw, str) else _jsonable(raw)
        results.append(entry)
    return {
        "id": f"rerank-{uuid.uuid4().hex}",
        "model": reranker.model_id,
        "results": results,
        "failures": [{"index": f.source, "reason": f.reason} for f in result.failures],
        "usage": {"total_tokens": tokens},
    }


def explain(engine: ServeEngine, body: ExplainRequest) -> dict:
    """POST /explain: `Reranker.explain` for one pair (readout attention, not attribution)."""
    reranker = _reranker(engine, body.model)
    allow = engine.config.allow_remote_images
    if (body.document is None) == (body.document_id is None):
        raise InputError("give the `document` to explain, or the `document_id` of an item in the collection (one of them)")
    query = bounded_text(reranker, request_item(body.query, "query", allow))
    record = None
    if body.document_id is not None:  # the search page's "why this result": the item's own file
        record = engine.record(body.document_id)
        document = stored_item(record)  # only the file indexed (stored_files)
    else:
        document = request_item(body.document, "document", allow)
    document = bounded_text(reranker, document)
    tokens = _count_pair_tokens(engine, reranker, query, [document], body.instruction)
    payload = ExplainPayload(query, document, body.instruction, body.layer)  # on the model thread, like scoring
    why = engine.wait(engine.batcher.submit("rerank", payload, tokens)).to_dict()
    # by id: which item it is (`faste-mm explain` names its file)
    return why if record is None else {**why, "item": {"id": record.id, "uri": record.uri, "page": record.page}}


def bounded_text(reranker, item: Item) -> Item:
    """`item` with a long text cut before it is tokenized whole, where the model would cut it
    anyway: the reranker keeps the first max_length tokens of a pair, so a text whose first
    `TEXT_CHARS_PER_TOKEN` x max_length characters already hold more tokens than that is cut
    there (as /search cuts a query: a 5 MB document costs what its first tokens cost; what the
    model sees and the tokens counted against --max-request-tokens are those of the whole text).
    A text of longer tokens is tried again with 4x as many characters."""
    if item.text is None:
        return item
    serializer = reranker.serializer
    tokenizer = getattr(serializer, "tokenizer", None) or serializer.processor.tokenizer
    max_length = serializer.config.max_length
    limit = TEXT_CHARS_PER_TOKEN * max_length
    while len(item.text) > limit:
        cut = item.text[:limit]
        # one token past max_length: the token the cut may split is never one the model keeps
        if len(tokenizer(cut, add_special_tokens=False)["input_ids"]) > max_length + 1:
            return replace(item, text=cut)
        limit *= 4
    return item


def _reranker(engine: ServeEngine, model: str | None):
    reranker = engine.reranker
    if reranker is None:
        raise InputError("this server has no reranker; start it with `faste-mm serve --rerank MODEL`")
    served = reranker.model_id
    if model is not None and model not in (served, served.rsplit("/", 1)[-1]):
        raise InputError(f"`model` is {model!r}, but this server reranks with {served!r}; pass that id or leave `model` out")
    return reranker


def _count_pair_tokens(engine: ServeEngine, reranker, query: Item, documents: list[Item], instruction: str | None) -> int:
    """Prompt tokens of every pair as the model will see them (`Reranker.pair_tokens`: a request's
    images are already decoded; an unreadable one fails here, named); RequestTooLargeError over the
    per-request limit."""
    try:
        prepared = reranker.prepare_query(query, instruction)
    except FasteError as error:
        raise InputError(str(error)) from None
    total = 0
    for index, document in enumerate(documents):
        try:
            total += reranker.pair_tokens(prepared, document)
        except FasteError as error:
            raise InputError(f"documents[{index}]: {error}") from None
        except Exception as error:  # the processor's own errors: still this input's fault
            raise InputError(f"documents[{index}]: cannot be serialized ({type(error).__name__}: {error})") from None
    _check_tokens(engine, total, "the request", "split it")
    return total


def _check_tokens(engine: ServeEngine, total: int, what: str, advice: str) -> None:
    """RequestTooLargeError (HTTP 413) when the pairs of one request are over --max-request-tokens
    (a reranked /search is checked by the engine, `ServeEngine._check_pairs`)."""
    if total > engine.config.max_request_tokens:
        raise RequestTooLargeError(f"{what} has {total} prompt tokens over its pairs; the limit is "
                                   f"{engine.config.max_request_tokens} (--max-request-tokens); {advice}")


def _jsonable(raw):
    if isinstance(raw, list):
        return [part.model_dump(exclude_none=True) if isinstance(part, BaseModel) else part for part in raw]
    return raw


def add_rerank_routes(app: FastAPI, engine: ServeEngine, auth) -> None:
    """Register POST /v1/rerank, /rerank (vLLM's alias) and /explain on `app`."""

    @app.post("/v1/rerank", dependencies=[auth])
    @app.post("/rerank", dependencies=[auth], include_in_schema=False)
    async def rerank_route(body: RerankRequest) -> dict:
        return await run_in_threadpool(rerank, engine, body)

    @app.post("/explain", dependencies=[auth])
    async def explain_route(body: ExplainRequest) -> dict:
        return await run_in_threadpool(explain, engine, body)

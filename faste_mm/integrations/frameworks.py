"""What the LangChain and LlamaIndex adapters share: the two sides of embedding (queries with the
query instruction and the full forward, documents with FastE) and a collection's search turned
into (text, metadata, score) rows. Plain Python over `Retriever` / `Embedder`: the adapters in
`integrations.langchain` and `integrations.llama_index` only translate to their framework's types.

Receives strings, image paths and the adapters' settings; hands back float32 vectors and
`FoundItem`s.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from faste_mm.errors import ConfigError
from faste_mm.retrieval.search_request import DEFAULTS, SearchRequest, options_for


class EmbeddingSides:
    """Queries and documents embedded as faste-mm embeds them.

    With a `collection`: exactly as `faste-mm search` and `faste-mm index` do for it (its model,
    pixels, FastE, dim; `Retriever.encode_queries` / `encode_documents`). Without: as `faste-mm
    embed` does, queries with the query instruction (`QUERY_INSTRUCTION` for vision-language
    models, the model's own for text models) and the full forward, documents with FastE at
    `r_max` (default `DOCUMENT_R_MAX`; 0 = the full forward).

    model: a loaded `Embedder`, a hub id or folder (None = `DEFAULT_MODEL`, or the collection's).
    """

    def __init__(self, model=None, *, collection: str | os.PathLike | None = None, r_max: float | None = None,
                 instruction: str | None = None, device: str = "auto", dtype: str = "auto") -> None:
        from faste_mm.model.embedder import Embedder
        from faste_mm.model.faste import FastEConfig
        from faste_mm.retrieval.profile import DEFAULT_MODEL, DOCUMENT_R_MAX
        from faste_mm.retrieval.retriever import Retriever

        self.instruction = instruction
        if collection is not None:
            if r_max is not None:
                raise ConfigError("r_max: a collection's documents are embedded with its own FastE settings; leave "
                                  "r_max out with a collection")
            if isinstance(model, Embedder):
                self.retriever = Retriever(model, collection=collection, query_instruction=instruction)
            else:
                self.retriever = Retriever.for_collection(collection, None if model is None else str(model),
                                                          device=device, dtype=dtype, query_instruction=instruction)
            self.fast_e = None
        else:
            embedder = model if isinstance(model, Embedder) else Embedder.from_pretrained(
                str(model or DEFAULT_MODEL), device=device, dtype=dtype)
            self.retriever = Retriever(embedder, query_instruction=instruction)
            ratio = DOCUMENT_R_MAX if r_max is None else r_max
            self.fast_e = None if ratio == 0 else FastEConfig(r_max=ratio)
        self.has_collection = collection is not None

    @property
    def embedder(self):
        return self.retriever.embedder

    def queries(self, texts: Sequence[str]) -> np.ndarray:
        """[n, d] float32: `Retriever.encode_queries` (InputError naming a bad query)."""
        return self.retriever.encode_queries(list(texts)).embeddings

    def documents(self, inputs: Sequence[object]) -> np.ndarray:
        """[n, d] float32 for texts, image paths (as `Path`) or `Item`s embedded as documents."""
        if self.has_collection:
            return self.retriever.encode_documents(list(inputs)).embeddings
        return self.embedder.encode_documents(list(inputs), fast_e=self.fast_e).embeddings


def image_paths(uris: Sequence[str | os.PathLike]) -> list[Path]:
    """Image inputs as paths (a str would be embedded as text)."""
    return [Path(uri) for uri in uris]


@dataclass(frozen=True, slots=True)
class FoundItem:
    """One search hit as a framework document: its words (the item's stored text, else its
    file's path), the score the ranking used, and metadata with id, uri, page, score,
    rerank_score, found_by and the item's own `metadata`."""

    id: int
    text: str
    score: float
    uri: str
    page: int | None
    metadata: dict[str, Any]


def adapter_options() -> dict[str, Any]:
    """The search options the LangChain and LlamaIndex retrievers take, by name, with their
    defaults (`SearchRequest`'s declarations for the "adapters" front end; `rerank` also takes a
    reranker's hub id or folder, loaded once)."""
    return {name: DEFAULTS[name] for name in options_for("adapters") if name != "query"}


class CollectionSearch:
    """`Retriever.search` over one collection, as `faste-mm search` runs it: the request's options
    (`adapter_options`), the reranker given by name (loaded once), else the collection's own
    unless rerank=False."""

    def __init__(self, collection: str | os.PathLike | None = None, *, retriever=None, device: str = "auto") -> None:
        from faste_mm.retrieval.retriever import Retriever

        self.retriever = retriever if retriever is not None else Retriever.open(collection, device=device)
        self.device = device
        self._named: tuple[str, Any] | None = None

    @staticmethod
    def check(where: str, options: Mapping[str, Any]) -> None:
        """ConfigError naming `where` and the option for an unknown or invalid one (at construction)."""
        SearchRequest.of(where, query="-", **{**options, "rerank": None})

    def search(self, query: str, options: Mapping[str, Any]) -> list[FoundItem]:
        from faste_mm.indexers import Collection

        options = dict(options)
        if isinstance(options.get("rerank"), str):
            options["rerank"] = self._reranker(options["rerank"])
        hits = self.retriever.search(query, **options)
        with Collection.open(self.retriever.collection) as col:
            texts = col.texts([hit.id for hit in hits])
        return [FoundItem(hit.id, texts.get(hit.id) or hit.uri,
                          hit.score if hit.rerank_score is None else hit.rerank_score, hit.uri, hit.page,
                          {"id": hit.id, "uri": hit.uri, "page": hit.page, "score": hit.score,
                           "rerank_score": hit.rerank_score, "found_by": hit.found_by,
                           "metadata": None if hit.metadata is None else dict(hit.metadata),
                           "facts": None if hit.facts is None else hit.facts.to_dict()})
                for hit in hits]

    def _reranker(self, name: str):
        if self._named is None or self._named[0] != name:
            from faste_mm.model.rerank.reranker import Reranker

            self._named = (name, Reranker.from_pretrained(name, device=self.device))
        return self._named[1]

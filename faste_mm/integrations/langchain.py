"""LangChain adapters: `FasteMMEmbeddings` (an `Embeddings` for any LangChain vector store, with
`embed_image` for multimodal ones) and `FasteMMRetriever` (a `BaseRetriever` over a faste-mm
collection). Thin: the embedding and the search are `integrations.frameworks`' over `Retriever` /
`Embedder`; this module only speaks LangChain's types.

Needs the extra: pip install 'faste-mm[langchain]' (langchain-core).

Example:
    >>> from langchain_core.vectorstores import InMemoryVectorStore
    >>> store = InMemoryVectorStore(FasteMMEmbeddings(collection="photos"))
    >>> FasteMMRetriever(collection="photos", k=5).invoke("a red bicycle")  # [Document(...), ...]
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, Optional

from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict, PrivateAttr, create_model

from faste_mm.integrations.frameworks import CollectionSearch, EmbeddingSides, adapter_options, image_paths


class FasteMMEmbeddings(Embeddings):
    """faste-mm vectors for LangChain: `embed_query` with the query instruction and the full
    forward, `embed_documents` / `embed_image` as documents (FastE), as the CLI embeds them
    (see `EmbeddingSides`: with `collection`, exactly as its search and index do).

    model: an `Embedder`, or a hub id / folder (default Qwen/Qwen3-VL-Embedding-2B, or the
    collection's model). r_max: FastE for documents without a collection (default 0.5; 0 = full
    forward). instruction: the query task (default: the model's retrieval instruction).
    Raises InputError naming an input that cannot be embedded.
    """

    def __init__(self, model=None, *, collection: str | os.PathLike | None = None, r_max: float | None = None,
                 instruction: str | None = None, device: str = "auto", dtype: str = "auto") -> None:
        self.sides = EmbeddingSides(model, collection=collection, r_max=r_max, instruction=instruction,
                                    device=device, dtype=dtype)

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self.sides.documents(texts).tolist()

    def embed_query(self, text: str) -> list[float]:
        return self.sides.queries([text])[0].tolist()

    def embed_image(self, uris: list[str]) -> list[list[float]]:
        """Image files as documents (the method LangChain's multimodal stores call)."""
        return self.sides.documents(image_paths(uris)).tolist()

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        return await asyncio.to_thread(self.embed_documents, texts)

    async def aembed_query(self, text: str) -> list[float]:
        return await asyncio.to_thread(self.embed_query, text)

    async def aembed_image(self, uris: list[str]) -> list[list[float]]:
        return await asyncio.to_thread(self.embed_image, uris)


class _CollectionRetriever(BaseRetriever):
    """A faste-mm collection as a LangChain retriever: `invoke(query)` returns the hits of
    `faste-mm search` (same request, same defaults, same order) as `Document`s whose page_content
    is the item's text (else its path) and whose metadata holds id, uri, page, score,
    rerank_score, found_by, the item's own `metadata` and its facts.

    Fields: collection (name or folder; None = the default one), device, and every search option
    of `adapter_options()` (declared once in `SearchRequest`; docs/search.md "Search options"):
    k, mode, where, type, path, since, until, sort, min_score, rescore, lexical_syntax, rerank
    (None: the collection's reranker; False: none; or a reranker's hub id or folder), rerank_top.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    collection: Optional[str] = None
    device: str = "auto"
    _search: Optional[CollectionSearch] = PrivateAttr(default=None)

    def model_post_init(self, context: Any) -> None:
        CollectionSearch.check("FasteMMRetriever", self._options())

    @classmethod
    def from_retriever(cls, retriever, **fields: Any) -> "FasteMMRetriever":
        """Over a `faste_mm.Retriever` already made (its model loaded once, shared)."""
        made = cls(collection=str(retriever.collection), **fields)
        made._search = CollectionSearch(retriever=retriever, device=made.device)
        return made

    def _options(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in adapter_options()}

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        if self._search is None:
            self._search = CollectionSearch(self.collection, device=self.device)
        found = self._search.search(query, self._options())
        return [Document(page_content=item.text, metadata=item.metadata, id=str(item.id)) for item in found]


# its search options are fields made from the declarations: one per option, its default the request's
FasteMMRetriever = create_model("FasteMMRetriever", __base__=_CollectionRetriever, __module__=__name__,
                                **{name: (Any, default) for name, default in adapter_options().items()})
FasteMMRetriever.__doc__ = _CollectionRetriever.__doc__

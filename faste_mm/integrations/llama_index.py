"""LlamaIndex adapters: `FasteMMEmbedding` (a `MultiModalEmbedding`: text, query and image
embeddings for `VectorStoreIndex` / `MultiModalVectorStoreIndex`) and `FasteMMRetriever` (a
`BaseRetriever` over a faste-mm collection, returning `NodeWithScore`s). Thin: the embedding and
the search are `integrations.frameworks`' over `Retriever` / `Embedder`.

Needs the extra: pip install 'faste-mm[llamaindex]' (llama-index-core).

Example:
    >>> from llama_index.core import Settings, VectorStoreIndex
    >>> Settings.embed_model = FasteMMEmbedding()
    >>> FasteMMRetriever(collection="photos", k=5).retrieve("a red bicycle")  # [NodeWithScore(...), ...]
"""

from __future__ import annotations

import asyncio
import io
import os
from typing import Any, List, Union

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.embeddings import MultiModalEmbedding
from llama_index.core.schema import ImageNode, NodeWithScore, QueryBundle, TextNode
from PIL import Image
from pydantic import PrivateAttr

from faste_mm.integrations.frameworks import CollectionSearch, EmbeddingSides, FoundItem, adapter_options
from faste_mm.kinds import kind_name


class FasteMMEmbedding(MultiModalEmbedding):
    """faste-mm vectors for LlamaIndex: queries with the query instruction and the full forward,
    texts and images as documents (FastE), as the CLI embeds them (see `EmbeddingSides`; with
    `collection`, exactly as its search and index do). LlamaIndex's batch calls hand the batch
    hooks at most `embed_batch_size` inputs at a time.

    model: an `Embedder`, or a hub id / folder (default Qwen/Qwen3-VL-Embedding-2B, or the
    collection's). r_max: FastE for documents without a collection (default 0.5; 0 = full
    forward). instruction: the query task. Raises InputError naming an input that cannot be embedded.
    """

    _sides: EmbeddingSides = PrivateAttr()

    def __init__(self, model=None, *, collection: str | os.PathLike | None = None, r_max: float | None = None,
                 instruction: str | None = None, device: str = "auto", dtype: str = "auto",
                 embed_batch_size: int = 16, **kwargs: Any) -> None:
        sides = EmbeddingSides(model, collection=collection, r_max=r_max, instruction=instruction, device=device,
                               dtype=dtype)
        super().__init__(model_name=sides.embedder.model_id, embed_batch_size=embed_batch_size, **kwargs)
        self._sides = sides

    @classmethod
    def class_name(cls) -> str:
        return "FasteMMEmbedding"

    def _get_query_embedding(self, query: str) -> List[float]:
        return self._sides.queries([query])[0].tolist()

    def _get_text_embedding(self, text: str) -> List[float]:
        return self._get_text_embeddings([text])[0]

    def _get_text_embeddings(self, texts: List[str]) -> List[List[float]]:
        return self._sides.documents(texts).tolist()

    def _get_image_embedding(self, img_file_path: Union[str, io.BytesIO]) -> List[float]:
        return self._get_image_embeddings([img_file_path])[0]

    def _get_image_embeddings(self, img_file_paths: List[Union[str, io.BytesIO]]) -> List[List[float]]:
        return self._sides.documents([_image(value) for value in img_file_paths]).tolist()

    async def _aget_query_embedding(self, query: str) -> List[float]:
        return await asyncio.to_thread(self._get_query_embedding, query)

    async def _aget_text_embedding(self, text: str) -> List[float]:
        return await asyncio.to_thread(self._get_text_embedding, text)

    async def _aget_text_embeddings(self, texts: List[str]) -> List[List[float]]:
        return await asyncio.to_thread(self._get_text_embeddings, texts)

    async def _aget_image_embedding(self, img_file_path: Union[str, io.BytesIO]) -> List[float]:
        return await asyncio.to_thread(self._get_image_embedding, img_file_path)

    async def _aget_image_embeddings(self, img_file_paths: List[Union[str, io.BytesIO]]) -> List[List[float]]:
        return await asyncio.to_thread(self._get_image_embeddings, img_file_paths)


class FasteMMRetriever(BaseRetriever):
    """A faste-mm collection as a LlamaIndex retriever: the hits of `faste-mm search` (same
    settings, same order) as `NodeWithScore`s, an `ImageNode` (image_path = the file) for a
    picture, a `TextNode` of the item's text otherwise; node ids are item ids, metadata holds
    id, uri, page, score, rerank_score, found_by and the item's own `metadata`.

    collection: a name or folder (None = the default one), or `retriever`: a `faste_mm.Retriever`.
    options: the search options of `adapter_options()` (declared once in `SearchRequest`; those of
    `faste-mm search`: k, mode, where, type, path, since, until, sort, min_score, rescore,
    lexical_syntax, rerank (None: the collection's reranker; False: none; or a reranker's hub id
    or folder), rerank_top); other keywords go to LlamaIndex's BaseRetriever. ConfigError naming
    an invalid option.
    """

    def __init__(self, collection: str | os.PathLike | None = None, *, retriever=None, device: str = "auto",
                 **options: Any) -> None:
        names = adapter_options()
        self._settings = {**names, **{name: value for name, value in options.items() if name in names}}
        CollectionSearch.check("FasteMMRetriever", self._settings)
        self._search = CollectionSearch(collection, retriever=retriever, device=device)
        super().__init__(**{name: value for name, value in options.items() if name not in names})

    def _retrieve(self, query_bundle: QueryBundle) -> List[NodeWithScore]:
        found = self._search.search(query_bundle.query_str, self._settings)
        return [NodeWithScore(node=_node(item), score=item.score) for item in found]

    async def _aretrieve(self, query_bundle: QueryBundle) -> List[NodeWithScore]:
        return await asyncio.to_thread(self._retrieve, query_bundle)


def _node(item: FoundItem) -> TextNode:
    if kind_name(item.uri) == "image" and item.page is None:
        return ImageNode(id_=str(item.id), image_path=item.uri, text=item.text, metadata=item.metadata)
    return TextNode(id_=str(item.id), text=item.text, metadata=item.metadata)


def _image(value: Union[str, io.BytesIO]):
    """A LlamaIndex image input as the embedder takes it: a path, or the bytes decoded."""
    from pathlib import Path

    if isinstance(value, io.BytesIO):
        return Image.open(value).convert("RGB")
    return Path(value)

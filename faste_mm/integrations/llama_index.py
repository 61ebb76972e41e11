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
from typing import Any, List, Optional, Sequence, Union

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.embeddings import MultiModalEmbedding
from llama_index.core.schema import ImageNode, NodeWithScore, QueryBundle, TextNode
from PIL import Image
from pydantic import PrivateAttr

from faste_mm.integrations.frameworks import CollectionSearch, EmbeddingSides, FoundItem
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
    The other settings are those of `faste-mm search` (k, where, type, path, mode, rerank,
    rerank_top, no_rerank).
    """

    def __init__(self, collection: str | os.PathLike | None = None, *, retriever=None, k: int = 10,
                 where: Optional[dict[str, Any]] = None, type: Optional[Sequence[str]] = None,
                 path: Optional[str] = None, mode: str = "dense", rerank: Optional[str] = None, rerank_top: int = 50,
                 no_rerank: bool = False, device: str = "auto", **kwargs: Any) -> None:
        self._search = CollectionSearch(collection, retriever=retriever, device=device, rerank=rerank,
                                        no_rerank=no_rerank)
        self._settings = dict(k=k, where=where, type=None if not type else list(type), path=path, mode=mode,
                              rerank_top=rerank_top)
        super().__init__(**kwargs)

    def _retrieve(self, query_bundle: QueryBundle) -> List[NodeWithScore]:
        found = self._search.search(query_bundle.query_str, **self._settings)
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

"""Queries for a collection: the values a user searches with made into `Item`s (a file by its
kind's decoder), which of them are queries by example (embedded like documents), and the ranked
`Hit`s read off a `search.Found`. Receives query values; hands `Hit` lists to `Retriever.search`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from faste_mm.errors import ConfigError, InputError
from faste_mm.indexers.search import MODES as SEARCH_MODES
from faste_mm.indexers.search import SOURCE_NAMES, Found
from faste_mm.kinds import KINDS, kind_name
from faste_mm.model.items import Item, as_item
from faste_mm.retrieval.decoders import query_item
from faste_mm.retrieval.results import Hit

if TYPE_CHECKING:  # annotations only
    from faste_mm.model.embedder import EmbedResult


def as_query(value: object, position: int) -> Item:
    """A query: an `Item`, text, a PIL image, or a file made into a query by its kind's decoder
    (`decoders.query_item`: a text file by its text, a video, an image)."""
    if isinstance(value, Path) and kind_name(value) in KINDS and kind_name(value) != "pdf":
        return query_item(value, kind_name(value))
    item = as_item(value, position)
    if item.is_pdf and item.page is None:
        raise InputError(f"query {position}: {item.image} is a PDF; query with one page, "
                         f"Item(image=path, page=N)")
    return item


def check_mode(mode: str) -> None:
    """ConfigError for a search mode other than "dense", "lexical" or "hybrid"."""
    if mode not in SEARCH_MODES:
        raise ConfigError(f"search mode must be one of {SEARCH_MODES}, got {mode!r}")


def query_texts(items: Sequence[Item], mode: str) -> list[str] | None:
    """The words each query searches in mode "lexical" or "hybrid" (None for "dense"); InputError
    for a lexical query without text."""
    texts = None if mode == "dense" else [item.text or "" for item in items]
    if mode == "lexical" and not all(texts):
        raise InputError(f"search: lexical mode searches words; query {texts.index('') + 1} has no text "
                         f"(use --mode dense or hybrid for an image or video query)")
    return texts


def by_example(items: Sequence[Item], instruction: str | None) -> list[int]:
    """Positions of the queries by example: an image or video alone, with no instruction given,
    embedded exactly like a document (so an indexed file finds itself with score ~1)."""
    return [i for i, it in enumerate(items)
            if instruction is None and it.instruction is None and not it.text
            and (it.image is not None or it.video is not None)]


def hits(found: Found) -> list[list[Hit]]:
    """The ranked hits of each query row of `found` (padding dropped)."""
    records = found.records

    def hit(row: int, col: int) -> Hit:
        i = int(found.ids[row, col])
        similarity = None if found.similarities is None else float(found.similarities[row, col])
        return Hit(i, float(found.scores[row, col]), records[i].uri, records[i].page, records[i].metadata,
                   SOURCE_NAMES[int(found.sources[row, col])], facts=records[i].facts, similarity=similarity)

    return [[hit(row, col) for col in np.flatnonzero(found.ids[row] >= 0)] for row in range(len(found.ids))]


def embed_queries(items: Sequence[Item], instruction: str | None, dim: int,
                  documents: Callable[[list[Item]], EmbedResult],
                  queries: Callable[..., EmbedResult]) -> np.ndarray:
    """Query vectors [q, dim] float32 in input order: queries by example embedded as `documents`,
    the others as `queries` (with the task `instruction`)."""
    example = by_example(items, instruction)
    with_task = [i for i in range(len(items)) if i not in set(example)]
    out = np.zeros((len(items), dim), dtype=np.float32)
    if example:
        out[example] = documents([items[i] for i in example]).embeddings
    if with_task:
        out[with_task] = queries([items[i] for i in with_task], instruction=instruction).embeddings
    return out

"""The second stage of a search: the embedding search's top-N hits read back from their files
and re-scored by a `Reranker` against the query; the best k come back with both scores.

Receives `Hit`s (best first by cosine) and the query `Item`; hands on `Hit`s with
`rerank_score` set, best first by it. A hit whose content cannot be read again (a moved file, a
text added from Python, whose text the collection does not keep) keeps `rerank_score=None`
and follows the reranked hits in its embedding order, with the reason logged.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import numpy as np

from faste_mm.errors import ConfigError, InputError
from faste_mm.model.items import Item
from faste_mm.kinds import UNSUPPORTED, kind_name
from faste_mm.retrieval.decoders import query_item
from faste_mm.retrieval.results import Hit

log = logging.getLogger(__name__)


def hit_item(hit: Hit) -> Item:
    """The item a hit was made from, read back from its uri by its kind's decoder (an image, a
    PDF page, a video, a text file). InputError (naming the uri) when there is nothing to read."""
    return stored_item(hit.uri, hit.page)


def stored_item(uri: str, page: int | None) -> Item:
    """The item of a collection row (uri, page) read back from its file (`hit_item`; the server's
    /explain by item id)."""
    path = Path(uri)
    kind = kind_name(path)
    if kind == UNSUPPORTED or not path.is_file():
        raise InputError(f"{uri}: no file to rerank (moved, or an item added from Python whose "
                         f"content the collection does not keep)")
    return query_item(path, kind, page)


def check_reranker(reranker: object, rerank_top: int) -> None:
    """ConfigError when `rerank=` is not a Reranker (an Embedder, a model name...), naming both,
    or `rerank_top` is below 1."""
    from faste_mm.model.rerank.reranker import Reranker

    if not isinstance(rerank_top, int) or rerank_top < 1:
        raise ConfigError(f"rerank_top must be an int >= 1 (hits re-scored), got {rerank_top!r}")
    if isinstance(reranker, Reranker):
        return
    what = type(reranker).__name__
    if what == "Embedder":
        raise ConfigError(f"rerank= got an Embedder ({getattr(reranker, 'model_id', '?')}), an embedding model; "
                          f"give a Reranker: Reranker.from_pretrained('Qwen/Qwen3-VL-Reranker-2B')")
    raise ConfigError(f"rerank= must be a faste_mm.Reranker (Reranker.from_pretrained(...)), got {what}")


def rerank_hits(reranker, query: Item, hits: list[Hit], k: int) -> list[Hit]:
    """Rerank `hits` (the embedding top-N, best first) for `query`; the best `k` with both scores."""
    if k < 1:
        raise ConfigError(f"k must be >= 1, got {k}")
    items, readable = [], []
    for position, hit in enumerate(hits):
        try:
            items.append(hit_item(hit))
            readable.append(position)
        except InputError as error:
            log.warning("not reranked: %s", error)
    result = reranker.score(query, items, on_error="skip")
    for failure in result.failures:
        log.warning("not reranked: %s", failure.reason)
    scores = np.full(len(hits), np.nan)
    for row, source in enumerate(result.sources):  # one row per item: every hit names one page
        if result.ok[row]:
            scores[readable[source]] = float(result.scores[row])
    scored = sorted((p for p in range(len(hits)) if not np.isnan(scores[p])), key=lambda p: (-scores[p], p))
    unscored = [p for p in range(len(hits)) if np.isnan(scores[p])]
    return [replace(hits[p], rerank_score=None if np.isnan(scores[p]) else float(scores[p])) for p in scored + unscored][:k]

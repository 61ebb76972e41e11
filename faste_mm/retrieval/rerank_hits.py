"""The second stage of a search: the embedding search's top-N hits read back from their files
(only while each is the file that was indexed: `retrieval.stored_files`) and re-scored by a
`Reranker` against the query; the best k come back with both scores.

Which reranker a search's `rerank` means is decided here too (`RerankerChoice`).
Receives `Hit`s (best first by cosine) and the query `Item`; hands on `Hit`s with
`rerank_score` set, best first by it. A hit whose content cannot be read again (a moved file, a
text added from Python, whose text the collection does not keep) keeps `rerank_score=None`
and follows the reranked hits in its embedding order, with the reason logged.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from faste_mm.errors import ConfigError, InputError
from faste_mm.model.items import Item
from faste_mm.retrieval.profile import read_profile
from faste_mm.retrieval.results import Hit
from faste_mm.retrieval.stored_files import stored_item

log = logging.getLogger(__name__)


def hit_item(hit: Hit, records: Mapping[int, object]) -> Item:
    """The item a hit was made from, read back from its file (`retrieval.stored_files`: only while
    it is the file that was indexed). `records`: the hits' `ItemRecord`s by id. InputError
    (naming the item) when there is nothing to read."""
    record = records.get(hit.id)
    if record is None:
        raise InputError(f"id {hit.id}: no longer in the collection")
    return stored_item(record)


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


def load_collection_reranker(name: str, device: str) -> Any:
    """The reranker a collection records (`index --reranker`), loaded as `faste-mm search` loads
    it: the exact score (r_max 0, nothing protected) and the default tower cache, on `device`."""
    from faste_mm.model.rerank.reranker import Reranker

    return Reranker.from_pretrained(name, device=device)


class RerankerChoice:
    """Which reranker a search's `rerank` means for one retriever: the one given, none, or the
    collection's: the one a server shares (`use`), else the model its profile records, loaded on
    first use and kept. It exists so that choice and the one reranker model it keeps live together
    rather than as state on `Retriever`.

    device: where a collection's reranker loads (the embedding model's device), asked when it loads."""

    def __init__(self, device: Callable[[], str]) -> None:
        self._device = device
        self._kept: tuple[str, Any] | None = None  # (name, Reranker); name "": the one given to `use`

    def use(self, reranker: Any) -> None:
        """Rerank with this loaded `Reranker` wherever the collection's would be used, instead of
        loading the collection's (`faste-mm serve --rerank`: one model, shared with /v1/rerank)."""
        self._kept = ("", reranker)

    def choose(self, rerank: Any, root: Path) -> Any:
        """The reranker of a search's `rerank` on the collection at `root`: itself (a Reranker), none
        for False, and for None the collection's when it records one, for True the collection's or
        an InputError (the one of `use` when given)."""
        if rerank is False:
            return None
        if rerank is not None and rerank is not True:
            return rerank
        name = read_profile(root).reranker
        if self._kept is not None and self._kept[0] == "":  # use's
            return self._kept[1] if name is not None or rerank is True else None
        if name is None:
            if rerank is True:
                raise InputError(f"search: rerank=True, but the collection {root} has no reranker; give one "
                                 f"(rerank=Reranker.from_pretrained(...)), record one (faste-mm index --reranker MODEL) "
                                 f"or start the server with one (faste-mm serve --rerank MODEL)")
            return None
        if self._kept is None or self._kept[0] != name:
            self._kept = (name, load_collection_reranker(name, self._device()))
        return self._kept[1]


def rerank_hits(reranker, query: Item, hits: list[Hit], k: int, records: Mapping[int, object],
                read: Mapping[int, Item] | None = None) -> list[Hit]:
    """Rerank `hits` (the embedding top-N, best first) for `query`; the best `k` with both scores.
    records: the hits' `ItemRecord`s by id (`Collection.get`), whose files are read back.
    read: items already read back by id (`hit_item`: the server counts their tokens first), scored
    as they are, so each file is checked once and what is scored is what was counted."""
    if k < 1:
        raise ConfigError(f"k must be >= 1, got {k}")
    items, readable = [], []
    for position, hit in enumerate(hits):
        try:
            items.append(read[hit.id] if read is not None and hit.id in read else hit_item(hit, records))
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

"""`index --ray`, long PDFs: the driver commits a PDF of more than `chunk_pages` pages range by
range as its parts come back from the embedding actors, through the plain `index`'s own commit
(`ingest.commit_page_range`): every range but the last is stored without the file's mtime, so a
re-run sees the file as unfinished and embeds only the pages no range committed; the last range
commits the failures of all ranges and settles the file's stat.

Receives a long PDF of the plan (planned here: which pages are still to embed) and the outputs
of its parts (pages, vectors, failure reasons, in any order); hands on commits to the collection.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from faste_mm.indexers import ItemRecord
from faste_mm.model.cost import CostTally
from faste_mm.retrieval.ingest import IngestTally, PreparedChunk, commit_page_range, pages_left, prepare_chunk
from faste_mm.retrieval.scanning import ScannedFile
from faste_mm.scale.ray_workers import STAT_FIELDS

if TYPE_CHECKING:
    from faste_mm.indexers import Collection

log = logging.getLogger(__name__)


@dataclass
class LongPdf:
    """One long PDF on its way through the pipeline (mutable: parts arrive one by one).

    base: the record fields of its rows; todo: the pages this run embeds (in order); replace_uris:
    the file's old rows, replaced by the first range committed; chunk_pages: pages per commit."""

    file: ScannedFile
    base: dict
    todo: list[int]
    replace_uris: list[str]
    chunk_pages: int
    parts_seen: set[int] = field(default_factory=set)
    buffered: list[dict] = field(default_factory=list)  # part outputs not committed yet
    failures: list[ItemRecord] = field(default_factory=list)  # failed pages, committed with the last range
    settled: bool = False

    def add_part(self, col: "Collection", part: int, parts: int, output: dict, tally: IngestTally) -> bool:
        """Take one part's output; commit the buffered pages once they reach chunk_pages, and
        settle the file when this was its last part. True when this call settled it. A part
        delivered twice (a retried Ray call) is ignored."""
        if self.settled or part in self.parts_seen:
            return False
        self.parts_seen.add(part)
        self.buffered.append(output)
        is_last = len(self.parts_seen) == parts
        if is_last or sum(len(o["pages"]) for o in self.buffered) >= self.chunk_pages:
            self.commit(col, tally, is_last)
        return is_last

    def commit(self, col: "Collection", tally: IngestTally, is_last: bool) -> None:
        """Commit the buffered pages as one range (the last: with every failure and the stat)."""
        from faste_mm import EmbedResult, Failure, Item

        f = self.file
        items, vectors, ok, failed = [], [], [], []
        for output in self.buffered:
            count_output(tally, output)
            for page, vector, reason in zip(output["pages"], output["vectors"], output["reasons"]):
                if reason is not None:
                    failed.append(Failure(len(items), 0, "", reason))
                items.append(Item(image=f.path, page=page))  # the page's text layer goes into the row
                vectors.append(vector)
                ok.append(reason is None)
        self.buffered = []
        result = None
        if items:
            result = EmbedResult(np.stack(vectors).astype(np.float32, copy=False), items, [0] * len(items),
                                 np.array(ok, dtype=bool), failed)
        commit_page_range(col, f, self.base, result, self.failures, self.replace_uris, is_last, tally)
        self.replace_uris = []
        self.settled = is_last


def count_output(tally: IngestTally, output: dict) -> None:
    """Add one embedding task's token counts and stage seconds to the run's totals."""
    tally.cost = tally.cost + CostTally(**{name: output.get(name, 0) for name in STAT_FIELDS})


def plan_long_pdf(col: "Collection", f: ScannedFile, n_pages: int, changed: frozenset[str], chunk_pages: int,
                  in_flight: set[tuple[str, str]] | None) -> tuple[PreparedChunk, LongPdf | None]:
    """The file prepared as a chunk of its own (hash; an identical complete document reused, or
    a copy of content this run embeds deferred: see `prepare_chunk`), and, when it is to be
    embedded, its `LongPdf`: the pages that no range of an interrupted run committed."""
    prepared = prepare_chunk(col, [f], in_flight)
    if not prepared.to_embed:
        return prepared, None
    base = prepared.to_embed[0][0]
    todo, replace_uris = pages_left(col, f, base["content_hash"], n_pages, changed)
    return prepared, LongPdf(f, base, todo, replace_uris, chunk_pages)

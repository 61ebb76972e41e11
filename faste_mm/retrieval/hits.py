"""A search hit: the record `Retriever.search` returns and `faste-mm search` renders. Standard
library only, so the thin client (a search answered by a running server) renders the very same
records without importing numpy's model-side modules, FAISS or torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from faste_mm.indexers.facts import ItemFacts  # standard library only, like this module


@dataclass(frozen=True, slots=True)
class Hit:
    """One search result: item id, score, source uri, 1-based PDF page (None otherwise), the item's
    metadata and facts (date taken, camera, place...), and which side of the search found it (`found_by`: "dense", "lexical", "both", or "filters" for a query of filters only).
    The score is the inner product (cosine, vectors are unit-norm) in dense mode, -BM25 in lexical
    mode and the fused reciprocal-rank score in hybrid mode, where `similarity` carries the cosine
    (what `min_score` cuts on)."""

    id: int
    score: float
    uri: str
    page: int | None = None
    metadata: Mapping[str, Any] | None = None
    found_by: str = "dense"  # which side found it: "dense", "lexical", "both" (hybrid), "filters"
    rerank_score: float | None = None  # the reranker's score, when the search reranked (retrieval.rerank_hits)
    facts: ItemFacts | None = None  # what the file says about itself (photo_metadata)
    similarity: float | None = None  # hybrid mode: the cosine with the query (the score is a fused rank)

    def to_dict(self) -> dict[str, Any]:
        data = {"id": self.id, "score": self.score, "uri": self.uri, "page": self.page,
                "metadata": dict(self.metadata) if self.metadata is not None else None, "found_by": self.found_by,
                "facts": self.facts.to_dict() if self.facts is not None else None}
        if self.rerank_score is not None:
            data["rerank_score"] = self.rerank_score
        if self.similarity is not None:
            data["similarity"] = self.similarity
        return data

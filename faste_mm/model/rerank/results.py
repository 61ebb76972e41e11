"""What a reranker hands back: each candidate's score in input order with the failures
(`RerankResult`), the best first (`Ranking` of `RankedDocument`s), and what the call cost
(`RerankStats`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from faste_mm.errors import ConfigError
from faste_mm.model.cost import CostTally
from faste_mm.model.items import Failure, Item
from faste_mm.model.runner import BatchTrace


@dataclass(frozen=True, slots=True)
class RerankStats(CostTally):
    """What one `score` call cost: pairs, its `CostTally` (prefix tokens before/after FastE, tower and
    decoder seconds), FLOPs, seconds."""

    n_pairs: int
    n_failed: int
    fast_e: dict | None
    protect: str
    protected_tokens: int  # sum of P_i (instruction + query positions) over the scored pairs
    flops_full: int
    flops_realised: int
    serialize_s: float
    forward_s: float
    elapsed_s: float
    batches: list[BatchTrace] = field(default_factory=list)
    prefix_reused: int = 0  # shared prefix tokens computed once for this query (0: no reuse)
    prefix_s: float = 0.0  # seconds computing them

    @property
    def flops_reduction(self) -> float:
        return 1.0 - self.flops_realised / self.flops_full if self.flops_full else 0.0

    def to_dict(self) -> dict:
        data = asdict(self)
        data["flops_reduction"] = self.flops_reduction
        return data


@dataclass(frozen=True, slots=True)
class RankedDocument:
    """One scored candidate: `index` is its position in the documents given (a PDF's pages share
    it), `row` its row among the expanded documents."""

    index: int
    row: int
    score: float
    item: Item

    def to_dict(self) -> dict:
        return {"index": self.index, "row": self.row, "score": self.score, "item": self.item.describe()}


@dataclass(frozen=True, slots=True)
class RerankResult:
    """scores: float32 [n] in the order of the expanded documents (a PDF contributes a row per
    page), each in (0, 1); NaN where the candidate failed (`ok` False, reason in `failures`)."""

    scores: np.ndarray
    items: list[Item]
    sources: list[int]
    ok: np.ndarray
    failures: list[Failure] = field(default_factory=list)
    stats: RerankStats | None = None

    def ranked(self, top_n: int | None = None) -> list[RankedDocument]:
        """Scored candidates, best first (ties keep input order); at most `top_n`."""
        if top_n is not None and top_n < 0:
            raise ConfigError(f"top_n must be >= 0 or None, got {top_n}")
        rows = [row for row in np.argsort(-self.scores, kind="stable").tolist() if self.ok[row]]
        return [RankedDocument(self.sources[r], r, float(self.scores[r]), self.items[r]) for r in rows[:top_n]]


@dataclass(frozen=True, slots=True)
class Ranking:
    """`Reranker.rerank`: the best candidates first, the candidates that failed, the stats."""

    results: list[RankedDocument]
    failures: list[Failure]
    stats: RerankStats | None = None

    def to_dict(self) -> dict:
        return {
            "results": [r.to_dict() for r in self.results],
            "failures": [asdict(f) for f in self.failures],
            "stats": None if self.stats is None else self.stats.to_dict(),
        }

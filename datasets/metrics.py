"""Ranking metrics of the MMEB protocol: each query is ranked by dot product against its own
candidate list (the gold is candidate 0); Recall@k is hit@k for the one gold, nDCG@10 is binary.

Ties: candidates are ordered by `np.argsort(-scores, kind="stable")`, so among equal scores the
earlier candidate ranks first and the gold (candidate 0) wins every tie. This is the official
MMEB rule made deterministic: v1 scores `np.argmax(scores) == 0` (argmax returns the first
maximum), v2 ranks with `np.argsort(-scores)`. Ties are real here: duplicated candidates (the
same DocVQA answer string twice) share one embedding.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from faste_mm.errors import InputError

K_VALUES = (1, 5, 10)
NDCG_K = 10


def gold_ranks(query_vectors: np.ndarray, candidate_vectors: np.ndarray, lists: list[tuple[int, ...]]) -> np.ndarray:
    """0-based rank of the gold (first candidate of each list) among that query's candidates.

    Args:
        query_vectors: float32 [Q, d], one row per query.
        candidate_vectors: float32 [C, d], unique candidates.
        lists: for each query, indices into candidate_vectors, gold first.
    Returns int64 [Q].
    """
    if len(lists) != query_vectors.shape[0]:
        raise InputError(f"{query_vectors.shape[0]} query vectors but {len(lists)} candidate lists")
    ranks = np.empty(len(lists), dtype=np.int64)
    for i, ids in enumerate(lists):
        scores = candidate_vectors[list(ids)] @ query_vectors[i]  # [n_i]
        order = np.argsort(-scores, kind="stable")
        ranks[i] = int(np.flatnonzero(order == 0)[0])
    return ranks


@dataclass(frozen=True, slots=True)
class RankingScores:
    """Mean over queries; recall@k = share of queries whose gold is in the top k."""

    recall_at_1: float
    recall_at_5: float
    recall_at_10: float
    ndcg_at_10: float

    def to_dict(self) -> dict[str, float]:
        return {"recall@1": self.recall_at_1, "recall@5": self.recall_at_5, "recall@10": self.recall_at_10, "ndcg@10": self.ndcg_at_10}


def score_ranks(ranks: np.ndarray) -> RankingScores:
    """Recall@1/5/10 and nDCG@10 from 0-based gold ranks (one relevant item: IDCG = 1)."""
    if ranks.size == 0:
        raise InputError("no queries to score")
    ndcg = np.where(ranks < NDCG_K, 1.0 / np.log2(ranks + 2.0), 0.0)
    recall = {k: float(np.mean(ranks < k)) for k in K_VALUES}
    return RankingScores(recall[1], recall[5], recall[10], float(ndcg.mean()))


def retention(score: float, full: float) -> float | None:
    """score / full (1.0 = the full forward's quality); None when the full score is 0."""
    return None if full == 0 else score / full

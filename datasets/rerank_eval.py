"""Two-stage MMEB evaluation: the embedder ranks each query's own candidates (full forward, from
the evaluator's embedding cache when it holds them), then a reranker re-scores that query's top-N, once per reranker setting (full, FastE at each
r_max, with or without protect="query"). Recall@1/5/10 and nDCG@5 before and after.

A gold outside the top-N keeps its first-stage rank; inside, its rank is its place in the
reranked top-N (ties keep the embedder's order). Receives `TaskData`, an `Embedder` and a
`Reranker`; hands on `RerankRow`s (`rerank_table` renders them).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from faste_mm.datasets.encoding import NO_PROGRESS, EmbeddingCache, ProgressSink
from faste_mm.datasets.mmeb import TaskData
from faste_mm.datasets.protocol import full_forward_vectors
from faste_mm.errors import ConfigError
from faste_mm.model.embedder import Embedder
from faste_mm.model.faste import FastEConfig
from faste_mm.model.rerank.reranker import PROTECT_MODES, Reranker

RERANK_K = (1, 5, 10)
RERANK_NDCG_K = 5


@dataclass(frozen=True, slots=True)
class RerankScores:
    recall_at_1: float
    recall_at_5: float
    recall_at_10: float
    ndcg_at_5: float

    @classmethod
    def from_ranks(cls, ranks: np.ndarray) -> "RerankScores":
        """From 0-based gold ranks (one relevant candidate per query: IDCG = 1)."""
        recall = {k: float(np.mean(ranks < k)) for k in RERANK_K}
        ndcg = np.where(ranks < RERANK_NDCG_K, 1.0 / np.log2(ranks + 2.0), 0.0)
        return cls(recall[1], recall[5], recall[10], float(ndcg.mean()))


@dataclass(frozen=True, slots=True)
class RerankRow:
    """One (task, reranker setting): metrics before (embedder alone) and after reranking."""

    task: str
    r_max: float
    protect: str
    top: int
    before: RerankScores
    after: RerankScores
    pairs: int
    seconds: float
    prefix_kept: float  # kept / all prefix tokens over the scored pairs (1.0 = full forward)

    def to_dict(self) -> dict:
        return asdict(self)


def first_stage(query_vectors: np.ndarray, candidate_vectors: np.ndarray, lists: list[tuple[int, ...]]) -> list[np.ndarray]:
    """Per query, its candidate positions (into its own list) best first by dot product;
    ties keep list order (the gold, position 0, wins them, as `metrics.gold_ranks`)."""
    return [np.argsort(-(candidate_vectors[list(ids)] @ query_vectors[i]), kind="stable") for i, ids in enumerate(lists)]


def reranked_rank(order: np.ndarray, top_scores: np.ndarray) -> int:
    """0-based rank of the gold (position 0) after reranking the first len(top_scores) of `order`
    by `top_scores` (NaN = a candidate that failed: last)."""
    top = len(top_scores)
    rank = int(np.flatnonzero(order == 0)[0])
    if rank >= top:
        return rank
    scores = np.where(np.isnan(top_scores), -np.inf, top_scores)
    new_order = order[:top][np.argsort(-scores, kind="stable")]
    return int(np.flatnonzero(new_order == 0)[0])


def evaluate_rerank(
    embedder: Embedder,
    reranker: Reranker,
    tasks: list[TaskData],
    *,
    top: int = 20,
    r_max: tuple[float, ...] = (0.0,),
    protect: tuple[str, ...] = ("none",),
    cache_dir: str | Path | None = None,
    progress: ProgressSink = NO_PROGRESS,
) -> list[RerankRow]:
    """The embedder's full-forward ranking, then each reranker setting on every query's top-`top`.
    The reranker's instruction is each query's own MMEB instruction. `cache_dir`: the evaluator's
    embedding cache (`evaluate`'s, same keys): vectors found there are not embedded again."""
    if top < 1:
        raise ConfigError(f"rerank top must be >= 1 candidates, got {top}")
    for mode in protect:
        if mode not in PROTECT_MODES:
            raise ConfigError(f"rerank protect must be one of {', '.join(PROTECT_MODES)}, got {mode!r}")
    cache = None if cache_dir is None else EmbeddingCache(cache_dir, embedder.model_id)
    rows = []
    for task in tasks:
        queries, candidates = full_forward_vectors(embedder, task, cache, progress)
        lists = [query.candidates for query in task.queries]
        orders = first_stage(queries, candidates, lists)
        before = np.array([int(np.flatnonzero(order == 0)[0]) for order in orders])
        candidate_items = task.candidate_items()
        for ratio in r_max:
            for mode in (("none",) if ratio == 0 else protect):
                # one tower cache (and resized images) for every setting: the same candidates
                setting = reranker.variant(fast_e=FastEConfig(r_max=ratio), protect=mode)
                progress.start(f"{task.spec.subset} rerank r={ratio} {mode}", len(task.queries))
                after, pairs, prefix, kept, started = [], 0, 0, 0, time.perf_counter()
                for query, ids, order in zip(task.query_items(), lists, orders):
                    shortlist = [candidate_items[ids[j]] for j in order[:top]]
                    result = setting.score(query, shortlist)
                    after.append(reranked_rank(order, result.scores))
                    pairs += len(shortlist)
                    prefix += result.stats.prefix_tokens
                    kept += result.stats.kept_prefix_tokens
                    progress.advance(1)
                rows.append(RerankRow(task.spec.key, ratio, mode, top, RerankScores.from_ranks(before),
                                      RerankScores.from_ranks(np.array(after)), pairs, time.perf_counter() - started,
                                      kept / prefix if prefix else 1.0))
    return rows


def rerank_table(rows: list[RerankRow]) -> str:
    """Markdown: per task and setting, Recall@1/5/10 and nDCG@5 before -> after, seconds."""
    lines = ["| task | reranker r_max | protect | top | R@1 | R@5 | R@10 | nDCG@5 | pairs/s | prefix kept |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        b, a = row.before, row.after
        cells = [f"{getattr(b, f):.3f} -> {getattr(a, f):.3f}" for f in ("recall_at_1", "recall_at_5", "recall_at_10", "ndcg_at_5")]
        rate = row.pairs / row.seconds if row.seconds else 0.0
        lines.append(f"| {row.task} | {row.r_max} | {row.protect} | {row.top} | " + " | ".join(cells)
                     + f" | {rate:.1f} | {100 * row.prefix_kept:.0f}% |")
    return "\n".join(lines)

"""The evaluation protocol: for each task, queries embedded once with the full forward; the
candidates embedded once per setting (full, then each method at each r_max, at matched
per-sample budgets); every query ranked against its own candidates; metrics and costs relative
to the full forward. Receives `TaskData` and an `Embedder`; hands on `EvalResults`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from faste_mm.model.faste import FastEConfig
from faste_mm.model.embedder import Embedder
from faste_mm.errors import ConfigError

from faste_mm.datasets.encoding import (
    NO_PROGRESS,
    EmbeddingCache,
    EncodeStats,
    ProgressSink,
    encode_downscaled,
    encode_items,
    fingerprint,
)
from faste_mm.datasets.metrics import gold_ranks, score_ranks
from faste_mm.datasets.mmeb import TaskData
from faste_mm.datasets.results import EvalResults, SettingResult, TaskResult

log = logging.getLogger(__name__)

METHODS = ("faste", "fixed", "fastv", "random", "block-last", "downscale")
WARMUP_ITEMS = 8


@dataclass(frozen=True, slots=True)
class Setting:
    """One way of embedding the candidates. method "full" is the reference (r_max 0)."""

    method: str
    r_max: float
    fast_e: FastEConfig | None = None

    @property
    def key(self) -> str:
        return "full" if self.method == "full" else f"{self.method}-r{self.r_max:.2f}"

    def to_dict(self) -> dict:
        return {"method": self.method, "r_max": self.r_max, "fast_e": None if self.fast_e is None else self.fast_e.to_dict()}


@dataclass(frozen=True, slots=True)
class EvalConfig:
    """Settings of `faste-mm eval`.

    r_max: target removal ratios; 0 is the full forward (every method equals it there).
    methods: "faste" (Algorithm 1, alignment trigger + readout ranking), "fixed" (readout ranking
        before `fast_e.trigger_layer`), "fastv" (after layer 2, attention averaged over query
        positions), "random" / "block-last" (FastE's trigger, other rankings), "downscale" (fewer pixels).
    fast_e: the FastE settings every swept setting shares (its r_max is replaced by each of
        `r_max`): warmup_layer and threshold (l_w, theta; None = backbone defaults, 8 and 0.70 for
        Qwen3-VL) for the methods with FastE's trigger, trigger_layer for "fixed" (None = half the
        depth, 14 of 28 layers), seed for "random".
    """

    r_max: tuple[float, ...] = (0.0, 0.3, 0.5, 0.7)
    methods: tuple[str, ...] = METHODS
    fast_e: FastEConfig = FastEConfig(r_max=0.0)

    def __post_init__(self) -> None:
        if not self.r_max:
            raise ConfigError("EvalConfig.r_max needs at least one ratio in [0, 1), e.g. 0,0.3,0.5,0.7")
        for r in self.r_max:
            FastEConfig(r_max=r)  # the range, with the field's own message
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown or not self.methods:
            raise ConfigError(f"EvalConfig.methods must be some of {', '.join(METHODS)}; got {', '.join(self.methods) or 'none'}")
        if not isinstance(self.fast_e, FastEConfig):
            raise ConfigError(f"EvalConfig.fast_e must be a FastEConfig, got {type(self.fast_e).__name__}")

    def settings(self, num_layers: int) -> list[Setting]:
        """Full first, then each method at each positive r_max, in the order given."""
        fixed = num_layers // 2 if self.fast_e.trigger_layer is None else self.fast_e.trigger_layer
        if fixed >= num_layers:
            raise ConfigError(f"FastEConfig.trigger_layer of the 'fixed' baseline must be < {num_layers} (layers of "
                              f"this model), got {fixed}")
        out = [Setting("full", 0.0)]
        for method in dict.fromkeys(self.methods):
            for r in sorted(set(r for r in self.r_max if r > 0)):
                out.append(Setting(method, r, self._fast_e(method, r, fixed)))
        return out

    def _fast_e(self, method: str, r: float, fixed: int) -> FastEConfig | None:
        trigger = dict(warmup_layer=self.fast_e.warmup_layer, threshold=self.fast_e.threshold)
        if method == "faste":
            return FastEConfig(r_max=r, **trigger)
        if method == "fixed":
            return FastEConfig(r_max=r, trigger_layer=fixed)
        if method == "fastv":
            return FastEConfig.fastv(r)
        if method in ("random", "block-last"):
            return FastEConfig(r_max=r, ranking=method, seed=self.fast_e.seed, **trigger)
        return None  # downscale: the full forward on smaller images

    def to_dict(self) -> dict:
        return {
            "r_max": list(self.r_max),
            "methods": list(self.methods),
            "fixed_layer": self.fast_e.trigger_layer,
            "warmup_layer": self.fast_e.warmup_layer,
            "threshold": self.fast_e.threshold,
            "seed": self.fast_e.seed,
        }


def evaluate(
    embedder: Embedder,
    tasks: list[TaskData],
    config: EvalConfig = EvalConfig(),
    *,
    cache_dir: str | Path | None = None,
    progress: ProgressSink = NO_PROGRESS,
) -> EvalResults:
    """Run every setting on every task.

    Args:
        embedder: the model; FastE settings resolve l_w / theta from its backbone defaults.
        tasks: loaded tasks (`load_task`).
        config: methods, ratios and baseline options.
        cache_dir: embeddings are stored here per (model, task, setting) and reused when the
            model, setting and items match (resume); None disables caching.
        progress: receives one phase per (task, side, setting).

    Example:
        >>> data = [load_task("nights", "mmeb/", limit=100)]
        >>> results = evaluate(Embedder.from_pretrained("Qwen/Qwen3-VL-Embedding-2B"), data)
        >>> results.summary()[0]["recall@10_retention"]
    """
    settings = config.settings(embedder.backbone.shape.num_layers)
    cache = None if cache_dir is None else EmbeddingCache(cache_dir, embedder.model_id)
    results = [evaluate_task(embedder, task, settings, cache, progress) for task in tasks]
    fast_e = embedder.resolve_fast_e(FastEConfig(r_max=0.0, warmup_layer=config.fast_e.warmup_layer,
                                                 threshold=config.fast_e.threshold))
    return EvalResults(
        model=embedder.model_id,
        config=config.to_dict(),
        settings=[s.to_dict() for s in settings],
        warmup_layer=fast_e.warmup_layer,
        threshold=fast_e.threshold,
        num_layers=embedder.backbone.shape.num_layers,
        tasks=results,
    )


def evaluate_task(
    embedder: Embedder, task: TaskData, settings: list[Setting], cache: EmbeddingCache | None, progress: ProgressSink = NO_PROGRESS
) -> TaskResult:
    """Queries once (full forward, shared by all settings), then the candidates per setting.

    `settings` starts with Full (as `EvalConfig.settings` orders them): it is the reference every
    other setting is measured against. Raises ConfigError otherwise.
    """
    if not settings or settings[0].method != "full":
        raise ConfigError(f"evaluate_task needs the Full setting first (the reference), got {[s.key for s in settings]}")
    subset = task.spec.subset
    query_items = task.query_items()
    queries, query_stats = _cached(embedder, cache, subset, "queries", None, query_items, True, progress)
    lists = [query.candidates for query in task.queries]
    candidate_items = task.candidate_items()
    if not _is_cached(embedder, cache, subset, settings[0], candidate_items):
        # Untimed warm-up on a few candidates: the reference (Full, timed first) must not pay
        # for lazy kernel/allocator set-up that later settings get for free.
        encode_items(embedder, candidate_items[:WARMUP_ITEMS], is_query=False)
    full_vectors, full_stats = _cached(embedder, cache, subset, settings[0].key, settings[0], candidate_items, False, progress)
    full_scores = score_ranks(gold_ranks(queries, full_vectors, lists))
    rows = [SettingResult.relative("full", 0.0, full_scores, full_stats, full_scores, full_stats)]
    log.info("%s full: recall@10 %.4f", subset, full_scores.recall_at_10)
    has_images = any(item.has_image for item in candidate_items)
    for setting in settings[1:]:
        if setting.method == "downscale" and not has_images:
            # Downscaling changes only images: on text-only candidates (DocVQA answers) it is
            # the Full forward over the same items, so Full's vectors and costs are reused.
            vectors, stats = full_vectors, full_stats
        else:
            vectors, stats = _cached(embedder, cache, subset, setting.key, setting, candidate_items, False, progress)
        scores = score_ranks(gold_ranks(queries, vectors, lists))
        rows.append(SettingResult.relative(setting.method, setting.r_max, scores, stats, full_scores, full_stats))
        log.info("%s %s: recall@10 %.4f", subset, setting.key, scores.recall_at_10)
    return TaskResult(
        task=task.spec.key,
        subset=subset,
        retrieval=task.spec.retrieval,
        n_queries=len(task.queries),
        n_candidates=len(task.candidates),
        query_stats=query_stats,
        settings=rows,
    )


def full_forward_vectors(
    embedder: Embedder, task: TaskData, cache: EmbeddingCache | None, progress: ProgressSink = NO_PROGRESS
) -> tuple[np.ndarray, np.ndarray]:
    """The task's query and candidate vectors under the full forward, under the same cache keys
    and fingerprints `evaluate` uses: a second stage (rerank_eval) reuses them, never re-embeds."""
    subset = task.spec.subset
    queries, _ = _cached(embedder, cache, subset, "queries", None, task.query_items(), True, progress)
    full = Setting("full", 0.0)
    candidates, _ = _cached(embedder, cache, subset, full.key, full, task.candidate_items(), False, progress)
    return queries, candidates


def _stamp(embedder: Embedder, setting: Setting | None, items) -> str:
    setting_dict = setting.to_dict() if setting is not None else {"method": "queries"}
    # Resolved config in the fingerprint: a changed backbone default (l_w, theta) is a new setting.
    if setting is not None and setting.fast_e is not None:
        setting_dict["fast_e"] = embedder.resolve_fast_e(setting.fast_e).to_dict()
    return fingerprint(embedder.model_id, setting_dict, items)


def _is_cached(embedder, cache, subset, setting: Setting, items) -> bool:
    return cache is not None and cache.load(subset, setting.key, _stamp(embedder, setting, items)) is not None


def _cached(embedder, cache, subset, key, setting, items, is_query, progress) -> tuple[np.ndarray, EncodeStats]:
    stamp = _stamp(embedder, setting, items)
    progress.start(f"{subset} {'queries' if is_query else 'candidates ' + key}", len(items))
    hit = cache.load(subset, key, stamp) if cache is not None else None
    if hit is not None and hit[0].shape[0] == len(items):
        progress.advance(len(items))
        return hit
    if setting is not None and setting.method == "downscale":
        vectors, stats = encode_downscaled(embedder, items, setting.r_max, progress=progress)
    else:
        fast_e = None if setting is None else setting.fast_e
        vectors, stats = encode_items(embedder, items, is_query=is_query, fast_e=fast_e, progress=progress)
    if cache is not None:
        cache.save(subset, key, stamp, vectors, stats)
    return vectors, stats

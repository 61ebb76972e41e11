"""Results of an evaluation: per (task, setting) quality and cost relative to the full forward,
and the macro summary over tasks (the table's "Avg. retention", docs/evaluation.md). `EvalResults.to_dict()` is
the documented `results.json` / `--json` schema (SCHEMA_VERSION).
"""

from __future__ import annotations

from dataclasses import dataclass

from faste_mm.datasets.encoding import EncodeStats
from faste_mm.datasets.metrics import RankingScores, retention

SCHEMA_VERSION = 1
HEADLINE = "recall@10"


def _ratio(numerator: float, denominator: float) -> float | None:
    return None if denominator == 0 else numerator / denominator


@dataclass(frozen=True, slots=True)
class SettingResult:
    """One setting on one task. Removal, FLOPs reduction and speedups are against the same
    task's full forward (for downscaling, removal counts the visual tokens it never creates)."""

    method: str
    r_max: float
    scores: RankingScores
    retention: dict[str, float | None]
    prefix_removal: float | None
    flops_reduction: float | None
    forward_speedup: float | None
    total_speedup: float | None
    stats: EncodeStats

    @classmethod
    def relative(cls, method, r_max, scores: RankingScores, stats: EncodeStats, full_scores: RankingScores, full: EncodeStats) -> "SettingResult":
        full_metrics = full_scores.to_dict()
        removal = _ratio(stats.kept_prefix_tokens, full.prefix_tokens)
        flops = _ratio(stats.flops_realised, full.flops_realised)
        return cls(
            method=method,
            r_max=r_max,
            scores=scores,
            retention={name: retention(value, full_metrics[name]) for name, value in scores.to_dict().items()},
            prefix_removal=None if removal is None else 1.0 - removal,
            flops_reduction=None if flops is None else 1.0 - flops,
            forward_speedup=_ratio(full.forward_s, stats.forward_s),
            total_speedup=_ratio(full.elapsed_s, stats.elapsed_s),
            stats=stats,
        )

    def to_dict(self) -> dict:
        return {
            "method": self.method,
            "r_max": self.r_max,
            "metrics": self.scores.to_dict(),
            "retention": self.retention,
            "prefix_removal": self.prefix_removal,
            "flops_reduction": self.flops_reduction,
            "mean_trigger_layer": self.stats.mean_trigger_layer,
            "forward_s": self.stats.forward_s,
            "total_s": self.stats.elapsed_s,  # results.json schema 1's name (docs/evaluation.md)
            "forward_speedup": self.forward_speedup,
            "total_speedup": self.total_speedup,
            "n_failed": self.stats.n_failed,
            "stats": self.stats.to_dict(),
        }


@dataclass(frozen=True, slots=True)
class TaskResult:
    task: str
    subset: str
    retrieval: str
    n_queries: int
    n_candidates: int  # unique candidates embedded per setting
    query_stats: EncodeStats
    settings: list[SettingResult]

    def setting(self, method: str, r_max: float) -> SettingResult | None:
        if r_max == 0:
            method = "full"
        return next((s for s in self.settings if s.method == method and s.r_max == r_max), None)

    def to_dict(self) -> dict:
        return {
            "task": self.task,
            "subset": self.subset,
            "retrieval": self.retrieval,
            "n_queries": self.n_queries,
            "n_candidates": self.n_candidates,
            "query_stats": self.query_stats.to_dict(),
            "settings": [s.to_dict() for s in self.settings],
        }


@dataclass(frozen=True, slots=True)
class EvalResults:
    model: str
    config: dict
    settings: list[dict]
    warmup_layer: int
    threshold: float
    num_layers: int
    tasks: list[TaskResult]

    def summary(self) -> list[dict]:
        """Per setting, over tasks: macro retention (mean of per-task ratios, as the
        table's Avg. retention), macro removal and FLOPs reduction, and speedups of the summed times."""
        rows = []
        for setting in self.settings:
            method, r_max = setting["method"], setting["r_max"]
            pairs = [(task.setting(method, r_max), task.setting("full", 0.0)) for task in self.tasks]
            pairs = [(s, f) for s, f in pairs if s is not None and f is not None]
            row = {"method": method, "r_max": r_max}
            for name in ("recall@1", "recall@10", "ndcg@10"):
                row[f"{name}_retention"] = _mean([s.retention[name] for s, _ in pairs])
            row["prefix_removal"] = _mean([s.prefix_removal for s, _ in pairs])
            row["flops_reduction"] = _mean([s.flops_reduction for s, _ in pairs])
            row["mean_trigger_layer"] = _mean([s.stats.mean_trigger_layer for s, _ in pairs])
            for kind, field in (("forward", "forward_s"), ("total", "elapsed_s")):
                full = sum(getattr(f.stats, field) for _, f in pairs)
                row[f"{kind}_speedup"] = _ratio(full, sum(getattr(s.stats, field) for s, _ in pairs))
            rows.append(row)
        return rows

    def to_dict(self) -> dict:
        return {
            "schema_version": SCHEMA_VERSION,
            "model": self.model,
            "num_layers": self.num_layers,
            "warmup_layer": self.warmup_layer,
            "threshold": self.threshold,
            "config": self.config,
            "settings": self.settings,
            "tasks": [task.to_dict() for task in self.tasks],
            "summary": self.summary(),
        }


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None

"""faste_mm.datasets: evaluation data loaders (MMEB format) and the MMEB evaluation protocol.

Stages in order: `mmeb` / `hub` (load tasks) -> `encoding` (embed per setting, cached) ->
`metrics` (gold ranks, Recall@k, nDCG@10) -> `protocol` (settings over tasks) -> `results` -> `report`.
"""

from faste_mm.datasets.encoding import EmbeddingCache, EncodeStats, ProgressSink
from faste_mm.datasets.hub import default_cache_dir, download_tasks
from faste_mm.datasets.metrics import RankingScores, gold_ranks, retention, score_ranks
from faste_mm.datasets.mmeb import TASKS, Candidate, Query, TaskData, TaskSpec, load_task, resolve_tasks, task_spec
from faste_mm.datasets.protocol import METHODS, EvalConfig, Setting, evaluate, evaluate_task
from faste_mm.datasets.report import paper_table, render_markdown, summary_table, write_report
from faste_mm.datasets.results import EvalResults, SettingResult, TaskResult

__all__ = [
    "METHODS",
    "TASKS",
    "Candidate",
    "EmbeddingCache",
    "EncodeStats",
    "EvalConfig",
    "EvalResults",
    "ProgressSink",
    "Query",
    "RankingScores",
    "Setting",
    "SettingResult",
    "TaskData",
    "TaskResult",
    "TaskSpec",
    "default_cache_dir",
    "download_tasks",
    "evaluate",
    "evaluate_task",
    "gold_ranks",
    "load_task",
    "paper_table",
    "render_markdown",
    "resolve_tasks",
    "retention",
    "score_ranks",
    "summary_table",
    "task_spec",
    "write_report",
]

"""Rendering of `EvalResults`: the cross-modal table of docs/evaluation.md (Recall@10 per task at each r_max,
then the average retention), a summary of every method, per-task details, and a plot of
retention against end-to-end speedup. Writes results.json, results.md and retention_speedup.png.
"""

from __future__ import annotations

import json
from pathlib import Path

from faste_mm.indexers.atomic_files import atomic_write_bytes
from faste_mm.datasets.results import EvalResults

RESULTS_JSON = "results.json"
RESULTS_MD = "results.md"
PLOT_PNG = "retention_speedup.png"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}%"


def _num(value: float | None, fmt: str = ".4f") -> str:
    return "-" if value is None else format(value, fmt)


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def paper_table(results: EvalResults, method: str | None = None) -> str:
    """Recall@10 per task: Full, then `method` (default FastE) at each positive r_max, and the
    macro Recall@10 retention relative to Full (docs/evaluation.md, "The cross-modal table")."""
    methods = results.config["methods"]
    method = method or ("faste" if "faste" in methods else methods[0])
    ratios = sorted(set(r for r in results.config["r_max"] if r > 0))
    header = ["Dataset", "Retrieval", "Full", *(f"{round(100 * r)}%" for r in ratios)]
    rows = []
    for task in results.tasks:
        cells = [task.setting("full", 0.0), *(task.setting(method, r) for r in ratios)]
        rows.append([task.subset, task.retrieval, *(_num(None if s is None else s.scores.recall_at_10) for s in cells)])
    summary = {(row["method"], row["r_max"]): row for row in results.summary()}
    average = [summary.get(("full", 0.0)), *(summary.get((method, r)) for r in ratios)]
    rows.append(["Avg. retention", "", *(_pct(None if row is None else row["recall@10_retention"]) for row in average)])
    return f"Recall@10, method {method} (l_w {results.warmup_layer}, theta {results.threshold:.2f})\n\n" + _table(header, rows)


def summary_table(results: EvalResults) -> str:
    """Every setting, macro over tasks."""
    header = ["Method", "r_max", "R@10 ret.", "R@1 ret.", "nDCG@10 ret.", "Removal", "FLOPs red.", "Trigger", "Fwd speedup", "E2E speedup"]
    rows = [
        [
            row["method"],
            f"{row['r_max']:.2f}",
            _pct(row["recall@10_retention"]),
            _pct(row["recall@1_retention"]),
            _pct(row["ndcg@10_retention"]),
            _pct(row["prefix_removal"]),
            _pct(row["flops_reduction"]),
            _num(row["mean_trigger_layer"], ".1f"),
            _num(row["forward_speedup"], ".2f") + "x",
            _num(row["total_speedup"], ".2f") + "x",
        ]
        for row in results.summary()
    ]
    return _table(header, rows)


def task_table(results: EvalResults, index: int) -> str:
    task = results.tasks[index]
    header = ["Method", "r_max", "R@1", "R@5", "R@10", "nDCG@10", "R@10 ret.", "Removal", "FLOPs red.", "Trigger", "Forward s", "E2E s", "Failed"]
    rows = [
        [
            s.method,
            f"{s.r_max:.2f}",
            _num(s.scores.recall_at_1),
            _num(s.scores.recall_at_5),
            _num(s.scores.recall_at_10),
            _num(s.scores.ndcg_at_10),
            _pct(s.retention["recall@10"]),
            _pct(s.prefix_removal),
            _pct(s.flops_reduction),
            _num(s.stats.mean_trigger_layer, ".1f"),
            f"{s.stats.forward_s:.2f}",
            f"{s.stats.elapsed_s:.2f}",
            str(s.stats.n_failed),
        ]
        for s in task.settings
    ]
    title = f"{task.subset} ({task.retrieval}): {task.n_queries} queries, {task.n_candidates} unique candidates"
    return f"{title}\n\n" + _table(header, rows)


def render_markdown(results: EvalResults) -> str:
    parts = [
        f"# faste-mm eval: {results.model}",
        "## Cross-modal table\n\n" + paper_table(results),
        "## All methods (macro over tasks; retention, removal and speedups relative to Full)\n\n" + summary_table(results),
        "## Per task",
        *(task_table(results, i) for i in range(len(results.tasks))),
        "Downscaling lowers max_pixels per image; text-only candidates (DocVQA answers) are unaffected, "
        "so there its row repeats Full's vectors and measurements. "
        "Removal counts prefix tokens removed (downscaling: visual tokens not created); FLOPs are the "
        "decoder's (docs/design.md's formula). Times: candidate encoding (model forward) and end to end.",
    ]
    return "\n\n".join(parts) + "\n"


def plot_retention_speedup(results: EvalResults, path: str | Path) -> Path:
    """Macro Recall@10 retention (%) against end-to-end speedup, one line per method."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    # Figure + Agg canvas, not pyplot: no global backend or figure state in library code.
    figure = Figure(figsize=(6.4, 4.4))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    summary = results.summary()
    full = next(row for row in summary if row["method"] == "full")
    for method in results.config["methods"]:
        rows = sorted((row for row in summary if row["method"] == method), key=lambda row: row["r_max"])
        points = [(r["total_speedup"], r["recall@10_retention"], r["r_max"]) for r in [full, *rows]]
        points = [(x, 100 * y, r) for x, y, r in points if x is not None and y is not None]
        if not points:
            continue
        axes.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=method)
        for x, y, r in points[1:]:
            axes.annotate(f"{round(100 * r)}%", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    axes.axhline(100.0, color="grey", linewidth=0.8, linestyle=":")
    axes.set_xlabel("end-to-end candidate encoding speedup vs Full (x)")
    axes.set_ylabel("Recall@10 retention, macro over tasks (%)")
    axes.set_title(f"{Path(results.model).name}: retention vs speedup", fontsize=10)
    axes.legend(fontsize=8)
    figure.tight_layout()
    path = Path(path)
    figure.savefig(path, dpi=120)
    return path


def write_report(results: EvalResults, out_dir: str | Path) -> dict[str, Path]:
    """Write results.json, results.md and the plot into `out_dir`; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / RESULTS_JSON, "markdown": out / RESULTS_MD, "plot": out / PLOT_PNG}
    atomic_write_bytes(paths["json"], (json.dumps(results.to_dict(), indent=2, ensure_ascii=False) + "\n").encode())
    atomic_write_bytes(paths["markdown"], render_markdown(results).encode())
    plot_retention_speedup(results, paths["plot"])
    return paths

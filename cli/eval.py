"""`faste-mm eval`: MMEB cross-modal retrieval (MSCOCO_t2i, DocVQA, NIGHTS) for Full, FastE and
the baselines at matched budgets; writes results.json, results.md and a retention/speedup plot
into --out and prints the tables (or --format json). Progress goes to stderr (cli/progress.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from faste_mm.cli.common import fail, setup_logging, stderr, stdout
from faste_mm.cli.options import (DEFAULT_BATCH_TOKENS, DEFAULT_MODEL, BatchTokens, Debug, Device, Dtype, Format,
                                  ImageRoot, Model, OutputFormat, RMax, Threshold, TriggerLayer, Unpadded, WarmupLayer,
                                  fast_e_config, ratios)
from faste_mm.cli.options import (RERANK_TOWER_CACHE_MB, Rerank, RerankProtect, RerankRMax, RerankTop, RerankTowerCacheMb,
                                  ratios)
from faste_mm.cli.progress import Progress
from faste_mm.errors import FasteError

_ALL_METHODS = "faste,fixed,fastv,random,block-last,downscale"


def eval_command(
    task: str = typer.Argument(..., envvar="FASTE_MM_TASK", help="mscoco | docvqa | nights | all."),
    data: Optional[Path] = typer.Option(
        None, envvar="FASTE_MM_DATA", help="Local MMEB_Test_Instruct folder (<task>.parquet/.jsonl or <task>/*.parquet, images/); default: download from the hub."
    ),
    image_root: ImageRoot = None,
    data_cache: Optional[Path] = typer.Option(None, envvar="FASTE_MM_DATA_CACHE", help="Where hub downloads are kept (default: the user cache, e.g. ~/.cache/faste-mm/mmeb)."),
    model: Model = None,
    r_max: RMax = None,
    methods: str = typer.Option(_ALL_METHODS, envvar="FASTE_MM_METHODS", help=f"Comma-separated methods from {_ALL_METHODS} (default: all)."),
    limit: Optional[int] = typer.Option(None, envvar="FASTE_MM_LIMIT", min=1, help="First N queries per task (default: all, 1000)."),
    out: Path = typer.Option(Path("faste-mm-eval"), "--out", "-o", envvar="FASTE_MM_EVAL_OUT", help="Output folder (results.json, results.md, plot, cache/). Default ./faste-mm-eval."),
    warmup_layer: WarmupLayer = None,
    threshold: Threshold = None,
    trigger_layer: TriggerLayer = None,
    seed: int = typer.Option(0, envvar="FASTE_MM_SEED", min=0, help="Seed of the 'random' ranking baseline. Default 0."),
    batch_tokens: BatchTokens = DEFAULT_BATCH_TOKENS,
    unpadded: Unpadded = "auto",
    chunk_items: int = typer.Option(256, envvar="FASTE_MM_CHUNK_ITEMS", help="Items serialized and length-sorted together (the first chunks are smaller). Default 256."),
    device: Device = "auto",
    dtype: Dtype = "auto",
    cache: bool = typer.Option(True, "--cache/--no-cache", envvar="FASTE_MM_EVAL_CACHE", help="Keep embeddings in --out/cache and resume from them. Default on."),
    output: OutputFormat = Format.table,
    rerank: Rerank = None,
    rerank_top: RerankTop = 20,
    rerank_r_max: RerankRMax = "0",
    rerank_protect: RerankProtect = "none",
    rerank_tower_cache_mb: RerankTowerCacheMb = RERANK_TOWER_CACHE_MB,
    debug: Debug = False,
) -> None:
    """Evaluate Full, FastE and baselines on MMEB MSCOCO_t2i / DocVQA / NIGHTS (Recall@1/5/10, nDCG@10)."""
    from faste_mm import BatchingConfig, Embedder
    from faste_mm.datasets import EvalConfig, download_tasks, evaluate, load_task, paper_table, resolve_tasks, summary_table, write_report

    setup_logging(debug)
    model = model or DEFAULT_MODEL
    try:
        config = EvalConfig(
            r_max=ratios(r_max),
            methods=tuple(m.strip() for m in methods.split(",") if m.strip()),
            fast_e=fast_e_config(0.0, warmup_layer, threshold, trigger_layer, seed),
        )
        specs = resolve_tasks(task)
        batching = BatchingConfig(batch_tokens=batch_tokens, chunk_items=chunk_items, unpadded=unpadded)
        if data is None:
            stderr.print(f"downloading {', '.join(s.subset for s in specs)} from the Hugging Face hub (cached)")
            data = download_tasks(specs, data_cache)
        tasks = [load_task(spec, data, image_root=image_root, limit=limit) for spec in specs]
        with Progress() as progress:
            with progress.loading(model):
                embedder = Embedder.from_pretrained(
                    model, device=device, dtype=dtype,
                    batching=batching)
            results = evaluate(embedder, tasks, config, cache_dir=out / "cache" if cache else None, progress=progress)
            reranked = _rerank(embedder, tasks, rerank, rerank_top, rerank_r_max, rerank_protect, device, dtype, progress,
                               out / "cache" if cache else None, rerank_tower_cache_mb)
        paths = write_report(results, out)
        if reranked is not None:
            paths["rerank"] = out / "rerank.json"
            paths["rerank"].write_text(json.dumps([row.to_dict() for row in reranked], indent=2))
    except FasteError as error:
        fail(error, debug)
    if output is Format.json:
        extra = {} if reranked is None else {"rerank": [row.to_dict() for row in reranked]}
        stdout.print_json(json.dumps({**results.to_dict(), **extra, "files": {k: str(v) for k, v in paths.items()}}))
        return
    stdout.print(paper_table(results), markup=False, highlight=False, soft_wrap=True)
    stdout.print()
    stdout.print(summary_table(results), markup=False, highlight=False, soft_wrap=True)
    if reranked is not None:
        from faste_mm.datasets.rerank_eval import rerank_table

        stdout.print()
        stdout.print(rerank_table(reranked), markup=False, highlight=False, soft_wrap=True)
    stderr.print(f"wrote {paths['json']}, {paths['markdown']}, {paths['plot']}")


def _rerank(embedder, tasks, model: str | None, top: int, r_max: str, protect: str, device: str, dtype: str, progress,
            cache_dir, tower_cache_mb: int):
    """The two-stage table of `--rerank` (None without it); `--rerank-protect both` runs none and query.
    The first stage's vectors come from the evaluation's own cache (`cache_dir`), not a second embedding."""
    if model is None:
        return None
    from faste_mm import Reranker
    from faste_mm.datasets.rerank_eval import evaluate_rerank
    from faste_mm.errors import ConfigError

    modes = {"none": ("none",), "query": ("query",), "both": ("none", "query")}
    if protect not in modes:
        raise ConfigError(f"--rerank-protect must be none, query or both, got {protect!r}")
    with progress.loading(model):
        reranker = Reranker.from_pretrained(model, device=device, dtype=dtype, tower_cache_bytes=tower_cache_mb << 20)
    return evaluate_rerank(embedder, reranker, tasks, top=top, r_max=ratios(r_max, (0.0,)), protect=modes[protect],
                           cache_dir=cache_dir, progress=progress)

"""`faste-mm eval`: MMEB cross-modal retrieval (MSCOCO_t2i, DocVQA, NIGHTS) for Full, FastE and
the baselines at matched budgets; writes results.json, results.md and a retention/speedup plot
into --out and prints the tables (or --format json). Progress goes to stderr (cli/progress.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from faste_mm.cli.common import (DEFAULT_MODEL, Format, chosen_format, debug_option, device_option, fail, format_option,
                                 image_root_option, legacy_json_option, parse_ratios, setup_logging, stderr, stdout,
                                 unpadded_option)
from faste_mm.cli.progress import Progress
from faste_mm.errors import FasteError

_ALL_METHODS = "faste,fixed,fastv,random,block-last,downscale"


def eval_command(
    task: str = typer.Argument(..., envvar="FASTE_MM_TASK", help="mscoco | docvqa | nights | all."),
    data: Optional[Path] = typer.Option(
        None, envvar="FASTE_MM_DATA", help="Local MMEB_Test_Instruct folder (<task>.parquet/.jsonl or <task>/*.parquet, images/); default: download from the hub."
    ),
    image_root: Optional[Path] = image_root_option(),
    data_cache: Optional[Path] = typer.Option(None, envvar="FASTE_MM_DATA_CACHE", help="Where hub downloads are kept (default: the user cache, e.g. ~/.cache/faste-mm/mmeb)."),
    model: str = typer.Option(DEFAULT_MODEL, envvar="FASTE_MM_MODEL", help="Hub id or local model directory."),
    r_max: str = typer.Option("0,0.3,0.5,0.7", envvar="FASTE_MM_EVAL_R_MAX", help="Comma-separated target removal ratios in [0, 1); 0 = Full. Default 0,0.3,0.5,0.7."),
    methods: str = typer.Option(_ALL_METHODS, envvar="FASTE_MM_METHODS", help=f"Comma-separated methods from {_ALL_METHODS} (default: all)."),
    limit: Optional[int] = typer.Option(None, envvar="FASTE_MM_LIMIT", min=1, help="First N queries per task (default: all, 1000)."),
    out: Path = typer.Option(Path("faste-mm-eval"), "--out", "-o", envvar="FASTE_MM_EVAL_OUT", help="Output folder (results.json, results.md, plot, cache/). Default ./faste-mm-eval."),
    fixed_layer: Optional[int] = typer.Option(None, envvar="FASTE_MM_FIXED_LAYER", help="Trigger layer of the 'fixed' baseline (default: half the depth, 14 of 28)."),
    warmup_layer: Optional[int] = typer.Option(None, envvar="FASTE_MM_WARMUP_LAYER", help="FastE warm-up layer l_w (default: the backbone's, 8)."),
    threshold: Optional[float] = typer.Option(None, envvar="FASTE_MM_THRESHOLD", help="FastE alignment threshold theta (default: the backbone's, 0.70 for Qwen3-VL-Embedding)."),
    seed: int = typer.Option(0, envvar="FASTE_MM_SEED", min=0, help="Seed of the 'random' ranking baseline. Default 0."),
    batch_tokens: int = typer.Option(16384, envvar="FASTE_MM_BATCH_TOKENS", help="Padded tokens per batch. Default 16384."),
    unpadded: str = unpadded_option(),
    chunk_items: int = typer.Option(256, envvar="FASTE_MM_CHUNK_ITEMS", help="Items serialized and length-sorted together (the first chunks are smaller). Default 256."),
    device: str = device_option(),
    dtype: str = typer.Option("auto", envvar="FASTE_MM_DTYPE", help="auto (bfloat16 on CUDA, float32 on CPU) | float32 | bfloat16 | float16."),
    cache: bool = typer.Option(True, "--cache/--no-cache", envvar="FASTE_MM_EVAL_CACHE", help="Keep embeddings in --out/cache and resume from them. Default on."),
    output: Format = format_option("Results on stdout: the tables, or results.json as JSON (default table)."),
    legacy_json: bool = legacy_json_option(),
    debug: bool = debug_option(),
) -> None:
    """Evaluate Full, FastE and baselines on MMEB MSCOCO_t2i / DocVQA / NIGHTS (Recall@1/5/10, nDCG@10)."""
    from faste_mm import BatchingConfig, Embedder
    from faste_mm.datasets import EvalConfig, download_tasks, evaluate, load_task, paper_table, resolve_tasks, summary_table, write_report

    setup_logging(debug)
    output = chosen_format(output, legacy_json)
    try:
        config = EvalConfig(
            r_max=parse_ratios(r_max),
            methods=tuple(m.strip() for m in methods.split(",") if m.strip()),
            fixed_layer=fixed_layer,
            warmup_layer=warmup_layer,
            threshold=threshold,
            seed=seed,
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
        paths = write_report(results, out)
    except FasteError as error:
        fail(error, debug)
    if output is Format.json:
        stdout.print_json(json.dumps({**results.to_dict(), "files": {k: str(v) for k, v in paths.items()}}))
        return
    stdout.print(paper_table(results), markup=False, highlight=False, soft_wrap=True)
    stdout.print()
    stdout.print(summary_table(results), markup=False, highlight=False, soft_wrap=True)
    stderr.print(f"wrote {paths['json']}, {paths['markdown']}, {paths['plot']}")

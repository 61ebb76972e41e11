"""The padded-token budget per batch, side by side in one process: the embedder (and the reranker,
`--reranker`) over the same inputs at several `BatchingConfig.batch_tokens`, mirrored rounds, the mean
kept. What chose `BATCH_TOKENS` (model/batching.py): 4,096 on a CPU, 16,384 on CUDA.

    faste-mm bench batch-tokens --inputs text:1000 --n 48 --threads 1
    faste-mm bench batch-tokens --inputs text:1000 --n 32 --reranker --threads 1
    faste-mm bench batch-tokens --inputs text:1000 --n 16 --scale-hidden 1 --layers 4 --dtype bfloat16 --threads 1
    faste-mm bench batch-tokens --inputs text:1000 --n 256 --device cuda --scale-hidden 1.0

`--layers N` keeps the real width with fewer decoder layers (the per-token cost of a layer is what
the budget changes), so the real 2B width fits a CPU run.
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

from faste_mm import BatchingConfig, Embedder
from faste_mm.bench.inputs import make_inputs
from faste_mm.bench.options import add_device, add_inputs, add_model, add_rounds, add_shape, add_threads, apply_threads, ints
from faste_mm.bench.rounds import mirrored_rounds
from faste_mm.bench.schema import SuiteRun
from faste_mm.model.cpu.machine import device_name
from faste_mm.tools.shapes import SHAPES, build_config, build_qwen3_vl_processor, qwen_tokenizer_dir

QUERY = "which report gives the invoice total for the city bicycle summary"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_inputs(parser, "text:1000", n=48)
    parser.add_argument("--budgets", default="16384,8192,4096,2048",
                        help="batch_tokens values, comma-separated; the first is the base (default 16384,8192,4096,2048)")
    add_shape(parser, scale=0.125)
    add_model(parser, "model (an embedder, or a reranker with --reranker)")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default the shape's; embedder only)")
    add_device(parser)
    parser.add_argument("--reranker", action="store_true", help="the reranker (the shape plus an LM head) instead of the embedder")
    add_rounds(parser, default=2)
    add_threads(parser)


def run(args: argparse.Namespace) -> SuiteRun:
    apply_threads(args)
    budgets = ints(args.budgets)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir()))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model"
        torch.manual_seed(0)
        inputs = make_inputs(args.inputs, args.n, Path(tmp) / "inputs", tokenizer)
        if args.reranker:
            from faste_mm.bench.rerank import build_reranker_shape
            from faste_mm.model.rerank.reranker import Reranker

            path = args.model or build_reranker_shape(path, args.shape, args.scale_hidden)
            models = {b: Reranker.from_pretrained(str(path), device=args.device, dtype=args.dtype, tower_cache_bytes=0, prefix_reuse=False,
                                                  batching=BatchingConfig(batch_tokens=b, workers=1)) for b in budgets}
            call = lambda model: model.score(QUERY, inputs)  # noqa: E731
        else:
            from transformers import Qwen3VLModel

            if args.model is not None:
                path = args.model
            else:
                preset = SHAPES[args.shape] if args.layers is None else replace(SHAPES[args.shape], layers=args.layers)
                Qwen3VLModel(build_config(preset, args.scale_hidden)).eval().save_pretrained(path)
                build_qwen3_vl_processor(tokenizer).save_pretrained(path)
            models = {b: Embedder.from_pretrained(str(path), device=args.device, dtype=args.dtype,
                                                  batching=BatchingConfig(batch_tokens=b, workers=1))
                      for b in budgets}
            call = lambda model: model.encode(inputs)  # noqa: E731
        first = models[budgets[0]]
        run_small = (lambda: first.score(QUERY, inputs[:2])) if args.reranker else (lambda: first.encode(inputs[:2]))
        run_small()  # untimed warm-up: lazy kernel set-up
        timed = mirrored_rounds({str(b): (lambda m=m: call(m)) for b, m in models.items()}, args.repeats, warmup=0,
                                device=first.backbone.device)
        device, dtype = device_name(first.backbone.device), str(first.backbone.dtype).removeprefix("torch.")
    base = timed[str(budgets[0])].mean
    rows = [{"batch_tokens": b, "s": timed[str(b)].mean, "items_per_s": args.n / timed[str(b)].mean,
             "x_first": base / timed[str(b)].mean, "seconds": list(timed[str(b)].seconds)} for b in budgets]
    params = {"model": "reranker" if args.reranker else "embedder", "shape": args.shape, "scale_hidden": args.scale_hidden,
              "layers": args.layers, "inputs": args.inputs, "n": args.n, "repeats": args.repeats}
    text = "\n".join([f"| batch_tokens | s | items/s | vs {budgets[0]} |", "|---|---|---|---|",
                      *(f"| {r['batch_tokens']} | {r['s']:.2f} | {r['items_per_s']:.2f} | {r['x_first']:.2f}x |" for r in rows)])
    return SuiteRun(rows, params, device, dtype, text=text)

"""The padded-token budget per batch, side by side in one process: the embedder (and the reranker,
`--reranker`) over the same inputs at several `BatchingConfig.batch_tokens`, mirrored rounds, the mean
kept. What chose `BATCH_TOKENS` (model/batching.py): 4,096 on a CPU, 16,384 on CUDA.

    python scripts/bench_batch_tokens.py --inputs text:1000 --n 48 --threads 1
    python scripts/bench_batch_tokens.py --inputs text:1000 --n 32 --reranker --threads 1
    python scripts/bench_batch_tokens.py --inputs text:1000 --n 16 --scale 1 --layers 4 --dtype bfloat16 --threads 1
    python scripts/bench_batch_tokens.py --inputs text:1000 --n 256 --device cuda --scale 1.0

`--layers N` keeps the real width with fewer decoder layers (the per-token cost of a layer is what
the budget changes), so the real 2B width fits a CPU run.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

from faste_mm import BatchingConfig, Embedder
from faste_mm.tools.bench import device_name
from faste_mm.tools.bench_inputs import make_inputs
from faste_mm.tools.bench_rounds import mirrored_rounds
from faste_mm.tools.shapes import SHAPES, build_config, build_qwen3_vl_processor, qwen_tokenizer_dir

QUERY = "which report gives the invoice total for the city bicycle summary"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", default="text:1000", help="text:TOKENS, image:WxH or page:WxH (tools/bench_inputs)")
    parser.add_argument("--n", type=int, default=48, help="items (documents of one query with --reranker)")
    parser.add_argument("--budgets", default="16384,8192,4096,2048", help="batch_tokens values, comma-separated; the first is the base")
    parser.add_argument("--shape", default="qwen3-vl-embedding-2b")
    parser.add_argument("--scale", type=float, default=0.125, help="width scale (1.0: the real width)")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default the shape's; embedder only)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto", help="auto, float32 or bfloat16")
    parser.add_argument("--reranker", action="store_true", help="the reranker (the shape plus an LM head) instead of the embedder")
    parser.add_argument("--repeats", type=int, default=2, help="mirrored rounds (even)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (1 on a shared CPU)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    budgets = [int(b) for b in args.budgets.split(",")]
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir()))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model"
        torch.manual_seed(0)
        inputs = make_inputs(args.inputs, args.n, Path(tmp) / "inputs", tokenizer)
        if args.reranker:
            sys.path.insert(0, str(Path(__file__).parent))
            from bench_rerank import build_reranker_shape
            from faste_mm.model.rerank.reranker import Reranker

            build_reranker_shape(path, args.shape, args.scale)
            models = {b: Reranker.from_pretrained(str(path), device=args.device, dtype=args.dtype, tower_cache_bytes=0, prefix_reuse=False,
                                                  batching=BatchingConfig(batch_tokens=b, workers=1)) for b in budgets}
            run = lambda model: model.score(QUERY, inputs)  # noqa: E731
        else:
            from transformers import Qwen3VLModel

            preset = SHAPES[args.shape] if args.layers is None else replace(SHAPES[args.shape], layers=args.layers)
            Qwen3VLModel(build_config(preset, args.scale)).eval().save_pretrained(path)
            build_qwen3_vl_processor(tokenizer).save_pretrained(path)
            models = {b: Embedder.from_pretrained(str(path), device=args.device, dtype=args.dtype,
                                                  batching=BatchingConfig(batch_tokens=b, workers=1))
                      for b in budgets}
            run = lambda model: model.encode(inputs)  # noqa: E731
        first = models[budgets[0]]
        run_small = (lambda: first.score(QUERY, inputs[:2])) if args.reranker else (lambda: first.encode(inputs[:2]))
        run_small()  # untimed warm-up: lazy kernel set-up
        timed = mirrored_rounds({str(b): (lambda m=m: run(m)) for b, m in models.items()}, args.repeats, warmup=0,
                                device=first.backbone.device)
        print(f"device: {device_name(first.backbone.device)}; torch {torch.__version__}; dtype {first.backbone.dtype}; "
              f"{'reranker' if args.reranker else 'embedder'} {args.shape} x{args.scale} ({args.layers or 'all'} layers); inputs {args.inputs} x{args.n}; "
              f"mean of {args.repeats} mirrored rounds; load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
        print("| batch_tokens | s | items/s | vs " + str(budgets[0]) + " |\n|---|---|---|---|")
        base = timed[str(budgets[0])].mean
        for b in budgets:
            seconds = timed[str(b)].mean
            print(f"| {b} | {seconds:.2f} | {args.n / seconds:.2f} | {base / seconds:.2f}x |")


if __name__ == "__main__":
    main()

"""Reranker speed, side by side in one process: the official path (transformers' own forward on
left-padded pairs + the official score formula), our full forward, and FastE at several r_max,
with and without protect="query". Random weights with a real reranker architecture (the 2B
shape: Qwen3-VL-Embedding-2B's decoder and vision tower plus an LM head), widths scaled for a CPU.

    python scripts/bench_rerank.py --inputs text:600 --top 20 --scale 0.125
    python scripts/bench_rerank.py --inputs page:640x900 --top 20 --scale 0.125

Prints a markdown table (for docs/benchmarks.md): seconds per query (all candidates), pairs/s,
speed-up over our full forward and over the official path, max |score - full score|, prefix kept.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from faste_mm.model.batching import BatchingConfig
from faste_mm.model.faste import FastEConfig
from faste_mm.model.items import expand_items
from faste_mm.model.reranker import Reranker
from faste_mm.tools.bench import device_name
from faste_mm.tools.bench_inputs import make_inputs
from faste_mm.tools.shapes import SHAPES, build_config, build_qwen3_vl_processor, qwen_tokenizer_dir

QUERY = "which report gives the invoice total for the city bicycle summary"


def build_reranker_shape(path: Path, shape: str, scale: float) -> Path:
    """The preset's Qwen3-VL architecture with an LM head (Qwen3VLForConditionalGeneration)."""
    from transformers import AutoTokenizer, Qwen3VLForConditionalGeneration

    torch.manual_seed(0)
    model = Qwen3VLForConditionalGeneration(build_config(SHAPES[shape], scale)).eval()
    model.save_pretrained(path)
    build_qwen3_vl_processor(AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir()))).save_pretrained(path)
    return path


def official_scores(lm, reranker: Reranker, documents: list, batch_size: int) -> np.ndarray:
    """Serialized pairs (the same ids; `tests/test_rerank.py` checks them against the official
    format), left-padded in batches of `batch_size` in input order, Qwen3VLModel's forward,
    last column through W[yes] - W[no] and a sigmoid (`compute_scores`)."""
    prepared = reranker.prepare_query(QUERY)
    pairs = [reranker.serializer(prepared, item) for item in expand_items(documents)[0]]
    pad = reranker.loaded.pad_token_id
    direction = reranker.loaded.yes_minus_no.to(lm.dtype)
    out = []
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start : start + batch_size]
        width = max(p.length for p in chunk)
        ids = torch.full((len(chunk), width), pad)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        mm = torch.zeros((len(chunk), width), dtype=torch.long)
        for b, p in enumerate(chunk):
            ids[b, width - p.length :], mask[b, width - p.length :] = p.input_ids, 1
            mm[b, width - p.length :] = p.mm_token_type_ids
        extra = {}
        for key in ("pixel_values", "image_grid_thw"):
            parts = [getattr(p, key) for p in chunk if getattr(p, key) is not None]
            if parts:
                extra[key] = torch.cat(parts)
        with torch.inference_mode():
            hidden = lm.model(input_ids=ids, attention_mask=mask, mm_token_type_ids=mm, **extra).last_hidden_state[:, -1]
        out.append(torch.sigmoid(hidden.float() @ direction.float()))
    return torch.cat(out).numpy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inputs", default="text:600", help="candidates: text:TOKENS or page:WxH (tools/bench_inputs)")
    parser.add_argument("--top", type=int, default=20, help="candidates per query (default 20)")
    parser.add_argument("--shape", default="qwen3-vl-embedding-2b", help="architecture preset (tools/shapes)")
    parser.add_argument("--scale", type=float, default=0.125, help="width scale for a CPU (default 0.125)")
    parser.add_argument("--r-max", default="0.3,0.5,0.7", help="FastE settings (comma-separated)")
    parser.add_argument("--official-batch", type=int, default=8, help="pairs per padded batch on the official path")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per setting; the best is kept")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        path = build_reranker_shape(Path(tmp) / f"{args.shape}-reranker", args.shape, args.scale)
        full = Reranker.from_pretrained(str(path), device="cpu", dtype="float32", batching=BatchingConfig(workers=1))
        from transformers import AutoTokenizer, Qwen3VLForConditionalGeneration

        lm = Qwen3VLForConditionalGeneration.from_pretrained(str(path)).eval()
        documents = make_inputs(args.inputs, args.top, Path(tmp) / "inputs", AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir())))
        settings = [("official (HF forward, padded)", None), ("faste-mm full", full)]
        for r_max in [float(r) for r in args.r_max.split(",")]:
            for protect in ("none", "query"):
                rr = Reranker(full.loaded, fast_e=FastEConfig(r_max=r_max), protect=protect, batching=full.batching)
                settings.append((f"FastE r={r_max}" + (" protect=query" if protect == "query" else ""), rr))
        rows, reference, official_s, full_s = [], None, None, None
        for name, reranker in settings:
            best, scores, kept = float("inf"), None, None
            for _ in range(args.repeats):
                started = time.perf_counter()
                if reranker is None:
                    scores = official_scores(lm, full, documents, args.official_batch)
                else:
                    result = reranker.score(QUERY, documents)
                    scores, stats = result.scores, result.stats
                    kept = stats.kept_prefix_tokens / stats.prefix_tokens
                best = min(best, time.perf_counter() - started)
            if reranker is None:
                official_s = best
            if reranker is full:
                reference, full_s = scores, best
            rows.append((name, best, scores, kept))
        print(f"device: {device_name(torch.device('cpu'))}; shape {args.shape} x{args.scale}; inputs {args.inputs}; "
              f"top {args.top}; query {len(QUERY.split())} words; best of {args.repeats}")
        print("| setting | s / query | pairs/s | vs our full | vs official | max abs score diff vs full | prefix kept |")
        print("|---|---|---|---|---|---|---|")
        for name, seconds, scores, kept in rows:
            diff = float(np.max(np.abs(scores - reference)))
            kept_text = "100%" if kept is None else f"{100 * kept:.0f}%"
            print(f"| {name} | {seconds:.2f} | {args.top / seconds:.1f} | {full_s / seconds:.2f}x | {official_s / seconds:.2f}x "
                  f"| {diff:.1e} | {kept_text} |")


if __name__ == "__main__":
    main()

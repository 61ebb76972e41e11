"""The reranker on pages end to end, as a user's defaults run it on a GPU: the official path
(left-padded batches of 8, preprocessing in line), faste-mm's full forward with its defaults
(background preprocessing, `batch_bytes` resolved for the device), the same with the CPU's
96 MiB batches, and FastE r=0.5 by alignment. Mirrored rounds; mean seconds per query, the
forward's own seconds, batch sizes and trigger layers. (The rerank suite races the settings with
one preprocessing thread, for a CPU; this one keeps each path's own preprocessing.)

    faste-mm bench rerank-e2e --device cuda --scale-hidden 1 --pages 20 --repeats 4   (gpu_bench.sh rerank)
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import replace
from pathlib import Path

from faste_mm.bench.inputs import make_inputs
from faste_mm.bench.options import add_device, add_dtype, add_model, add_rounds, add_shape
from faste_mm.bench.rerank import QUERY, build_reranker_shape, official_scores
from faste_mm.bench.rounds import mirrored_rounds
from faste_mm.bench.schema import SuiteRun
from faste_mm.model.cpu.machine import device_name
from faste_mm.model.batching import BATCH_BYTES
from faste_mm.model.faste import FastEConfig
from faste_mm.model.rerank.reranker import Reranker
from faste_mm.tools.shapes import qwen_tokenizer_dir


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_device(parser, dtype=False)
    add_dtype(parser, default="bfloat16", what="Every path's dtype")
    add_shape(parser, scale=1.0)
    add_model(parser, "reranker (Qwen3-VL with its LM head)")
    parser.add_argument("--pages", type=int, default=20, help="candidate pages per query (default 20)")
    parser.add_argument("--page", default="1240x1754", help="page size WxH (default 1240x1754)")
    add_rounds(parser, default=4)


def run(args: argparse.Namespace) -> SuiteRun:
    from transformers import AutoTokenizer, Qwen3VLForConditionalGeneration

    with tempfile.TemporaryDirectory() as tmp:
        path = args.model or build_reranker_shape(Path(tmp) / "rr", args.shape, args.scale_hidden)
        docs = make_inputs(f"page:{args.page}", args.pages, Path(tmp) / "in", AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir())))
        full = Reranker.from_pretrained(str(path), device=args.device, dtype=args.dtype, prefix_reuse=False, tower_cache_bytes=0)
        small = Reranker(full.loaded, batching=replace(full.batching, batch_bytes=BATCH_BYTES["cpu"]), prefix_reuse=False, tower_cache_bytes=0)
        r5 = Reranker(full.loaded, fast_e=FastEConfig(r_max=0.5), batching=full.batching, tower_cache_bytes=0)
        lm = Qwen3VLForConditionalGeneration.from_pretrained(str(path), dtype=full.backbone.dtype).to(full.backbone.device).eval()
        full.score(QUERY, docs[:2])  # untimed warm-ups: lazy kernel set-up
        official_scores(lm, full, docs[:2], 8)
        runs = [("official (batch 8, serial preprocessing)", lambda: official_scores(lm, full, docs, 8)),
                ("faste-mm full, defaults", lambda: full.score(QUERY, docs).stats),
                ("faste-mm full, batch_bytes 96 MiB", lambda: small.score(QUERY, docs).stats),
                ("FastE r=0.5 (adaptive)", lambda: r5.score(QUERY, docs).stats)]
        timed = mirrored_rounds(dict(runs), args.repeats, warmup=0, device=full.backbone.device)
        device, dtype, defaults = device_name(full.backbone.device), str(full.backbone.dtype).removeprefix("torch."), str(full.batching)
    off = timed[runs[0][0]].mean
    rows = []
    for name, _ in runs:
        s, st = timed[name].mean, timed[name].output
        row = {"path": name, "s_per_query": s, "x_official": off / s, "seconds": list(timed[name].seconds)}
        if hasattr(st, "batches"):
            row.update(forward_s=st.forward_s, batch_sizes=[b.batch_size for b in st.batches],
                       trigger_layers=[b.trigger_layer for b in st.batches], tower_s=sum(b.tower_s for b in st.batches))
        rows.append(row)
    text = "\n".join(["| path | s / query | vs official | rounds s | forward s | batches | triggers |", "|---|---:|---:|---|---:|---|---|",
                      *(f"| {r['path']} | {r['s_per_query']:.3f} | {r['x_official']:.2f}x | {' / '.join(f'{x:.3f}' for x in r['seconds'])} | "
                        f"{r.get('forward_s', float('nan')):.3f} | {r.get('batch_sizes', '-')} | {r.get('trigger_layers', '-')} |" for r in rows)])
    params = {"shape": args.shape, "scale_hidden": args.scale_hidden, "pages": args.pages, "page": args.page,
              "repeats": args.repeats, "batching_defaults": defaults}
    return SuiteRun(rows, params, device, dtype, text=text)

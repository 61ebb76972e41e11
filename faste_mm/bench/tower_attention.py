"""How fast can one long frame's attention get on this CPU? The bound behind the page numbers.

A page at the official cap is one frame of 7,200 patches; at the real 2B vision width (16 heads of
64) its full attention is most of the vision tower's time on a CPU. This suite times, per tower
layer, on the same random q/k/v, interleaved over rounds:

- torch's fused CPU attention (`scaled_dot_product_attention`) in float32 and in bfloat16;
- the three pieces any exact kernel must do, each at its best on this machine: the q.k^T products
  and the p.v products as cache-sized bfloat16 / float32 GEMM blocks, and the softmax's
  exponentials on cache-resident float32 rows (torch's vectorised exp).

"ideal bf16 kernel" = the sum of the bfloat16 pieces; torch's fused float32 kernel runs faster than
the sum of its float32 pieces, so the bound also grants a bfloat16 kernel that same fusion gain.
Its ratio to float32 SDPA bounds what bfloat16 can gain on a page's attention here.

    faste-mm bench tower-attention --threads 2 --rounds 3

With `--tower-depth N` it then races the whole tower on that frame: transformers' `Qwen3VLVisionModel`
(sdpa) against faste-mm's `PackedVisionTower` at the real 2B vision width with N blocks (24 in the
checkpoint; fewer keeps a run short, the ratio is per block), random weights, float32 and bfloat16,
alternating which goes first (`faste_mm.tools.bench_rounds`; `--device cuda` races it on a GPU):

    faste-mm bench tower-attention --threads 2 --rounds 5 --tower-depth 8
"""

from __future__ import annotations

import argparse

import torch
from torch.nn.functional import scaled_dot_product_attention

from faste_mm.bench.options import add_device, add_rounds
from faste_mm.bench.rounds import mirrored_rounds
from faste_mm.bench.schema import SuiteRun
from faste_mm.model.cpu.machine import device_name


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokens", type=int, default=7200, help="patches in the frame (default 7,200 = a page at the cap)")
    parser.add_argument("--heads", type=int, default=16, help="attention heads (default 16)")
    parser.add_argument("--head-dim", type=int, default=64, help="head width (default 64)")
    parser.add_argument("--block", type=int, default=512, help="query/key block of the piece timings (default 512)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    add_rounds(parser, default=3)
    parser.add_argument("--tower-depth", type=int, default=0, help="also race the whole tower with this many blocks (default 0: no)")
    add_device(parser, dtype=False, where=": where the whole-tower race runs (the pieces: cpu)")


def run(args: argparse.Namespace) -> SuiteRun:
    torch.set_num_threads(args.threads)
    n, a, d, b = args.tokens, args.heads, args.head_dim, args.block
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, a, n, d, generator=generator) for _ in range(3))
    blocks = a * (n / b) ** 2  # (query block, key block) pairs in one layer's attention

    def gemm_blocks(dtype: torch.dtype, inner: int, cols: int):
        """One [b, inner] @ [inner, cols] product per (query block, key block) pair of the layer."""
        left, right, out = torch.randn(b, inner).to(dtype), torch.randn(inner, cols).to(dtype), torch.empty(b, cols, dtype=dtype)

        def call() -> None:
            for _ in range(round(blocks)):
                torch.mm(left, right, out=out)
        return call

    def exp_rows() -> None:
        rows = torch.randn(64, 4096)  # 1 MiB: stays in cache like a fused kernel's tile
        out = torch.empty_like(rows)
        for _ in range(round(a * n * n / rows.numel())):
            torch.exp(rows, out=out)

    qb, kb, vb = q.bfloat16(), k.bfloat16(), v.bfloat16()
    cases = {
        "SDPA float32": lambda: scaled_dot_product_attention(q, k, v),
        "SDPA bfloat16": lambda: scaled_dot_product_attention(qb, kb, vb),
        "q.k^T bfloat16": gemm_blocks(torch.bfloat16, d, b),
        "q.k^T float32": gemm_blocks(torch.float32, d, b),
        "p.v bfloat16": gemm_blocks(torch.bfloat16, b, d),
        "p.v float32": gemm_blocks(torch.float32, b, d),
        "exp (float32, in cache)": exp_rows,
    }
    seconds = {name: timed.median for name, timed in mirrored_rounds(cases, args.repeats).items()}
    ideal = {dtype: seconds[f"q.k^T {dtype}"] + seconds["exp (float32, in cache)"] + seconds[f"p.v {dtype}"]
             for dtype in ("bfloat16", "float32")}
    base = seconds["SDPA float32"]
    # torch's fused float32 kernel beats the sum of its own pieces (shared tiles, no stores of scores):
    # granting a bfloat16 kernel the same fusion gain gives the optimistic bound.
    fused = base / ideal["float32"]
    rows = [{"piece": name, "s_per_layer": value} for name, value in seconds.items()]
    rows += [{"piece": f"ideal {dtype} kernel (sum of its pieces)", "s_per_layer": value} for dtype, value in ideal.items()]
    bounds = {"sdpa_bf16_vs_fp32": base / seconds["SDPA bfloat16"], "ideal_bf16_vs_sdpa_fp32": base / ideal["bfloat16"],
              "fusion_gain_fp32": fused, "bf16_bound_with_fusion": base / (ideal["bfloat16"] * fused)}
    lines = [f"one frame of {n} tokens, {a} heads x {d}, {args.threads} threads; seconds per tower layer (median of {args.repeats})",
             "| piece | s / layer |", "|---|---:|", *(f"| {r['piece']} | {r['s_per_layer']:.3f} |" for r in rows), "",
             f"SDPA bfloat16 vs SDPA float32: {bounds['sdpa_bf16_vs_fp32']:.2f}x",
             f"ideal bfloat16 kernel vs SDPA float32: {bounds['ideal_bf16_vs_sdpa_fp32']:.2f}x; with the fusion gain torch's "
             f"float32 kernel shows over its pieces ({fused:.2f}): {bounds['bf16_bound_with_fusion']:.2f}x (the most bfloat16 can gain here)"]
    device = device_name(torch.device("cpu"))
    if args.tower_depth:
        tower_rows, device = race_tower(args)
        rows += tower_rows
        lines += ["", f"whole tower on {args.device}, {args.tower_depth} blocks (median of {args.repeats})",
                  "| dtype | transformers s | packed s | packed speedup | max abs diff |", "|---|---:|---:|---:|---:|",
                  *(f"| {r['dtype']} | {r['transformers_s']:.2f} | {r['packed_s']:.2f} | {r['speedup']:.3f}x | {r['max_abs_diff']:.1e} |"
                    for r in tower_rows)]
    params = {"tokens": n, "heads": a, "head_dim": d, "block": b, "threads": args.threads, "repeats": args.repeats,
              "tower_depth": args.tower_depth, **bounds}
    return SuiteRun(rows, params, device, "float32/bfloat16", text="\n".join(lines))


def race_tower(args) -> tuple[list[dict], str]:
    """transformers' vision tower vs the packed one on one page frame, per dtype (see the docstring)."""
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel

    from faste_mm.model.backbones.vision_tower import PackedVisionTower

    torch.manual_seed(0)
    levels = [5, 11, 17] if args.tower_depth > 17 else [0]  # the checkpoint's DeepStack taps where they fit
    config = Qwen3VLVisionConfig(depth=args.tower_depth, hidden_size=args.heads * args.head_dim, intermediate_size=4096,
                                 num_heads=args.heads, out_hidden_size=2048, deepstack_visual_indexes=levels)
    config._attn_implementation = "sdpa"
    device = torch.device(args.device)
    visual = Qwen3VLVisionModel._from_config(config).eval().to(device)
    side = int(args.tokens ** 0.5)
    grid = torch.tensor([[1, side, args.tokens // side]], device=device)
    pixels = torch.randn(int(grid.prod()), config.in_channels * config.temporal_patch_size * config.patch_size ** 2,
                         device=device)
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        visual.to(dtype)
        packed, values = PackedVisionTower(visual), pixels.to(dtype)
        towers = {"transformers": lambda: visual(values, grid_thw=grid, return_dict=True).pooler_output,
                  "packed": lambda: packed(values, grid).merged}
        with torch.inference_mode():
            timed = mirrored_rounds(towers, args.repeats, device=device)
        theirs, ours = timed["transformers"].median, timed["packed"].median
        diff = float((timed["transformers"].output.float() - timed["packed"].output.float()).abs().max())
        rows.append({"piece": "whole tower", "dtype": str(dtype).removeprefix("torch."), "patches": int(grid.prod()),
                     "transformers_s": theirs, "packed_s": ours, "speedup": theirs / ours, "max_abs_diff": diff})
    return rows, device_name(device)

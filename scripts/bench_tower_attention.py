"""How fast can one long frame's attention get on this CPU? The bound behind the page numbers.

A page at the official cap is one frame of 7,200 patches; at the real 2B vision width (16 heads of
64) its full attention is most of the vision tower's time on a CPU. This script times, per tower
layer, on the same random q/k/v, interleaved over rounds:

- torch's fused CPU attention (`scaled_dot_product_attention`) in float32 and in bfloat16;
- the three pieces any exact kernel must do, each at its best on this machine: the q.k^T products
  and the p.v products as cache-sized bfloat16 / float32 GEMM blocks, and the softmax's
  exponentials on cache-resident float32 rows (torch's vectorised exp).

"ideal bf16 kernel" = the sum of the bfloat16 pieces; torch's fused float32 kernel runs faster than
the sum of its float32 pieces, so the bound also grants a bfloat16 kernel that same fusion gain.
Its ratio to float32 SDPA bounds what bfloat16 can gain on a page's attention here.

    python scripts/bench_tower_attention.py --threads 2 --rounds 3

With `--tower-depth N` it then races the whole tower on that frame: transformers' `Qwen3VLVisionModel`
(sdpa) against faste-mm's `PackedVisionTower` at the real 2B vision width with N blocks (24 in the
checkpoint; fewer keeps a run short, the ratio is per block), random weights, float32 and bfloat16,
alternating which goes first (`faste_mm.tools.bench_rounds`; `--device cuda` races it on a GPU):

    python scripts/bench_tower_attention.py --threads 2 --rounds 5 --tower-depth 8
"""

from __future__ import annotations

import argparse

import torch
from torch.nn.functional import scaled_dot_product_attention

from faste_mm.tools.bench_rounds import mirrored_rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=7200, help="patches in the frame (7,200 = a page at the cap)")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--block", type=int, default=512, help="query/key block of the piece timings")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds after one warm-up (median kept)")
    parser.add_argument("--tower-depth", type=int, default=0, help="also race the whole tower with this many blocks")
    parser.add_argument("--device", default="cpu", help="where the whole-tower race runs (cpu or cuda; the pieces: cpu)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    n, a, d, b = args.tokens, args.heads, args.head_dim, args.block
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, a, n, d, generator=generator) for _ in range(3))
    blocks = a * (n / b) ** 2  # (query block, key block) pairs in one layer's attention

    def gemm_blocks(dtype: torch.dtype, inner: int, cols: int):
        """One [b, inner] @ [inner, cols] product per (query block, key block) pair of the layer."""
        left, right, out = torch.randn(b, inner).to(dtype), torch.randn(inner, cols).to(dtype), torch.empty(b, cols, dtype=dtype)

        def run() -> None:
            for _ in range(round(blocks)):
                torch.mm(left, right, out=out)
        return run

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
    seconds = {name: timed.median for name, timed in mirrored_rounds(cases, args.rounds).items()}
    ideal = {dtype: seconds[f"q.k^T {dtype}"] + seconds["exp (float32, in cache)"] + seconds[f"p.v {dtype}"]
             for dtype in ("bfloat16", "float32")}
    print(f"one frame of {n} tokens, {a} heads x {d}, {args.threads} threads; seconds per tower layer (median of {args.rounds})")
    print("| piece | s / layer |\n|---|---:|")
    for name, value in seconds.items():
        print(f"| {name} | {value:.3f} |")
    for dtype, value in ideal.items():
        print(f"| ideal {dtype} kernel (sum of its pieces) | {value:.3f} |")
    base = seconds["SDPA float32"]
    # torch's fused float32 kernel beats the sum of its own pieces (shared tiles, no stores of scores):
    # granting a bfloat16 kernel the same fusion gain gives the optimistic bound.
    fused = base / ideal["float32"]
    print(f"\nSDPA bfloat16 vs SDPA float32: {base / seconds['SDPA bfloat16']:.2f}x")
    print(f"ideal bfloat16 kernel vs SDPA float32: {base / ideal['bfloat16']:.2f}x; with the fusion gain torch's float32 "
          f"kernel shows over its pieces ({fused:.2f}): {base / (ideal['bfloat16'] * fused):.2f}x (the most bfloat16 can gain here)")
    if args.tower_depth:
        race_tower(args)


def race_tower(args) -> None:
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
    print(f"\nwhole tower on {device}, {args.tower_depth} blocks, one frame of {int(grid.prod())} patches "
          f"(median of {args.rounds})")
    print("| dtype | transformers s | packed s | packed speedup | max abs diff |\n|---|---:|---:|---:|---:|")
    for dtype in (torch.float32, torch.bfloat16):
        visual.to(dtype)
        packed, values = PackedVisionTower(visual), pixels.to(dtype)
        towers = {"transformers": lambda: visual(values, grid_thw=grid, return_dict=True).pooler_output,
                  "packed": lambda: packed(values, grid).merged}
        with torch.inference_mode():
            timed = mirrored_rounds(towers, args.rounds, device=device)
        theirs, ours = timed["transformers"].median, timed["packed"].median
        diff = float((timed["transformers"].output.float() - timed["packed"].output.float()).abs().max())
        print(f"| {str(dtype).removeprefix('torch.')} | {theirs:.2f} | {ours:.2f} | {theirs / ours:.3f}x | {diff:.1e} |")


if __name__ == "__main__":
    main()

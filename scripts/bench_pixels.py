"""The cost of resolution: seconds per photo and per page at several image pixel caps
(`index --max-pixels`), per dtype, with the vision tower's share of the time and of the FLOPs.

Usage:
    python scripts/bench_pixels.py [--shape qwen3-vl-embedding-2b] [--scale-hidden 0.25] [--n 4]
        [--photo 640x480] [--page 1240x1754] [--max-pixels 1843200,1003520,501760,250880]
        [--dtypes auto,float32] [--kinds photo,page] [--repeats 2] [--threads N]

In ONE process, on the same generated inputs (noise photos; one-page text PDFs rendered as
`faste-mm bench --inputs page:WxH` does): per (dtype, cap), the full forward through
`Embedder.encode_documents` (seconds per item end to end, and the vision tower's own seconds from
`EmbedStats.tower_s`, the packed tower the forward runs); one warm-up per setting, then rounds that
visit every setting in turn, the order mirrored every other round (`faste_mm.tools.bench_rounds`),
medians over rounds. The tower share of time = tower seconds / forward
seconds; of FLOPs = `EmbedStats.flops_vision` / all. "vs official cap" compares with the same dtype
at the first cap; "vs float32" with float32 at the same cap.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch

from faste_mm import BatchingConfig, Embedder
from faste_mm.model.serialization import PIXELS_PER_VISUAL_TOKEN, SerializerConfig
from faste_mm.tools.bench import device_name
from faste_mm.tools.bench_inputs import make_inputs
from faste_mm.tools.bench_rounds import mirrored_rounds
from faste_mm.tools.shapes import build_shape_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="qwen3-vl-embedding-2b")
    parser.add_argument("--scale-hidden", type=float, default=0.25)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--photo", default="640x480")
    parser.add_argument("--page", default="1240x1754")
    parser.add_argument("--kinds", default="photo,page")
    parser.add_argument("--max-pixels", default="1843200,1003520,501760,250880")
    parser.add_argument("--dtypes", default="auto,float32", help="dtypes to run (each a model copy)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    caps = [int(c) for c in args.max_pixels.split(",")]
    with tempfile.TemporaryDirectory(prefix="faste-mm-pixels-") as work:
        path = build_shape_model(args.shape, Path(work) / "model", args.scale_hidden, torch.bfloat16)
        bases = {dtype: Embedder.from_pretrained(str(path), device="cpu", dtype=dtype,
                                                 batching=BatchingConfig(batch_tokens=1 << 16))
                 for dtype in args.dtypes.split(",")}
        names = {dtype: base.dtype_choice.name for dtype, base in bases.items()}
        any_base = next(iter(bases.values()))
        tokenizer = any_base.serializer.processor.tokenizer
        sizes = {"photo": args.photo, "page": args.page}
        inputs = {kind: make_inputs(f"{'image' if kind == 'photo' else 'page'}:{sizes[kind]}", args.n,
                                    Path(work) / kind, tokenizer) for kind in args.kinds.split(",")}
        print(f"{args.shape} at scale-hidden {args.scale_hidden:g} on {device_name(any_base.backbone.device)}, "
              f"torch threads {torch.get_num_threads()}; dtypes {', '.join(f'{d}={n}' for d, n in names.items())} "
              f"({any_base.dtype_choice.reason} for auto); {args.n} items per kind, median of {args.repeats} "
              f"interleaved rounds after a warm-up")
        print("| input | dtype | max_pixels | visual tokens / item | s / item | tower s / item | tower share of time | "
              "tower share of FLOPs | vs official cap | vs float32 |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for kind, items in inputs.items():
            settings = {(dtype, cap): base.with_serializer(SerializerConfig(max_pixels=cap))
                        for dtype, base in bases.items() for cap in caps}
            # interleaved, mirrored rounds after a warm-up: a load spike hits every setting alike
            calls = {key: (lambda e=embedder: e.encode_documents(items)) for key, embedder in settings.items()}
            timed = mirrored_rounds(calls, args.repeats)
            seconds = {key: t.median / len(items) for key, t in timed.items()}
            for (dtype, cap) in settings:
                tower = statistics.median(result.stats.tower_s for result in timed[dtype, cap].outputs) / len(items)
                s = timed[dtype, cap].output.stats  # the same every run
                tokens = sum(t * h * w // 4 for trace in s.batches for t, h, w in trace.image_grids)  # merge 2x2
                flops_share = s.flops_vision / (s.flops_full + s.flops_vision)
                fp32 = next((d for d, n in names.items() if n == "float32"), None)
                vs_fp32 = f"{seconds[fp32, cap] / seconds[dtype, cap]:.2f}x" if fp32 else "-"
                print(f"| {kind} {sizes[kind]} | {names[dtype]} | {cap:,} ({cap // PIXELS_PER_VISUAL_TOKEN} tokens) | "
                      f"{tokens / len(items):.0f} | {seconds[dtype, cap]:.3f} | {tower:.3f} | {tower / seconds[dtype, cap]:.0%} | "
                      f"{flops_share:.0%} | {seconds[dtype, caps[0]] / seconds[dtype, cap]:.2f}x | {vs_fp32} |", flush=True)


if __name__ == "__main__":
    main()

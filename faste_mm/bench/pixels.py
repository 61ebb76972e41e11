"""The cost of resolution: seconds per photo and per page at several image pixel caps
(`index --max-pixels`), per dtype, with the vision tower's share of the time and of the FLOPs.

    faste-mm bench pixels [--shape qwen3-vl-embedding-2b] [--scale-hidden 0.25] [--n 4]
        [--photo 640x480] [--page 1240x1754] [--max-pixels 1843200,1003520,501760,250880 (default)]
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
from faste_mm.bench.inputs import make_inputs
from faste_mm.bench.options import add_model, add_rounds, add_shape, add_threads, apply_threads, ints, names
from faste_mm.bench.rounds import mirrored_rounds
from faste_mm.bench.schema import SuiteRun
from faste_mm.model.cpu.machine import device_name
from faste_mm.model.official import PIXEL_SWEEP
from faste_mm.model.serialization import PIXELS_PER_VISUAL_TOKEN, SerializerConfig
from faste_mm.tools.shapes import build_shape_model


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_shape(parser, scale=0.25)
    add_model(parser)
    parser.add_argument("--n", type=int, default=4, help="items per kind (default 4)")
    parser.add_argument("--photo", default="640x480", help="photo size WxH (default 640x480)")
    parser.add_argument("--page", default="1240x1754", help="page size WxH (default 1240x1754)")
    parser.add_argument("--kinds", default="photo,page", help="photo, page or both (default photo,page)")
    parser.add_argument("--max-pixels", default=",".join(map(str, PIXEL_SWEEP)),
                        help="pixel caps, comma-separated; the first is the reference (default the official cap first)")
    parser.add_argument("--dtypes", default="auto,float32", help="dtypes to run (each a model copy; default auto,float32)")
    add_rounds(parser, default=2)
    add_threads(parser)


def run(args: argparse.Namespace) -> SuiteRun:
    apply_threads(args)
    caps = ints(args.max_pixels)
    rows = []
    with tempfile.TemporaryDirectory(prefix="faste-mm-pixels-") as work:
        path = args.model or build_shape_model(args.shape, Path(work) / "model", args.scale_hidden, torch.bfloat16)
        bases = {dtype: Embedder.from_pretrained(str(path), device="cpu", dtype=dtype,
                                                 batching=BatchingConfig(batch_tokens=1 << 16))
                 for dtype in names(args.dtypes)}
        dtype_names = {dtype: base.dtype_choice.name for dtype, base in bases.items()}
        any_base = next(iter(bases.values()))
        tokenizer = any_base.serializer.processor.tokenizer
        sizes = {"photo": args.photo, "page": args.page}
        inputs = {kind: make_inputs(f"{'image' if kind == 'photo' else 'page'}:{sizes[kind]}", args.n,
                                    Path(work) / kind, tokenizer) for kind in names(args.kinds)}
        for kind, items in inputs.items():
            settings = {(dtype, cap): base.with_serializer(SerializerConfig(max_pixels=cap))
                        for dtype, base in bases.items() for cap in caps}
            # interleaved, mirrored rounds after a warm-up: a load spike hits every setting alike
            calls = {key: (lambda e=embedder: e.encode_documents(items)) for key, embedder in settings.items()}
            timed = mirrored_rounds(calls, args.repeats)
            seconds = {key: t.median / len(items) for key, t in timed.items()}
            fp32 = next((d for d, n in dtype_names.items() if n == "float32"), None)
            for (dtype, cap) in settings:
                tower = statistics.median(result.stats.tower_s for result in timed[dtype, cap].outputs) / len(items)
                s = timed[dtype, cap].output.stats  # the same every run
                tokens = sum(t * h * w // 4 for trace in s.batches for t, h, w in trace.image_grids)  # merge 2x2
                rows.append({"kind": kind, "size": sizes[kind], "dtype": dtype_names[dtype], "max_pixels": cap,
                             "cap_tokens": cap // PIXELS_PER_VISUAL_TOKEN, "visual_tokens_per_item": tokens / len(items),
                             "s_per_item": seconds[dtype, cap], "tower_s_per_item": tower,
                             "tower_share_of_time": tower / seconds[dtype, cap],
                             "tower_share_of_flops": s.flops_vision / (s.flops_full + s.flops_vision),
                             "x_first_cap": seconds[dtype, caps[0]] / seconds[dtype, cap],
                             "x_float32": seconds[fp32, cap] / seconds[dtype, cap] if fp32 else None})
        device = device_name(any_base.backbone.device)
    params = {"model": str(args.model) if args.model else None, "shape": args.shape, "scale_hidden": args.scale_hidden, "n": args.n, "max_pixels": caps,
              "dtypes": dtype_names, "auto_reason": any_base.dtype_choice.reason, "repeats": args.repeats}
    return SuiteRun(rows, params, device, "/".join(sorted(set(dtype_names.values()))), text=_table(rows))


def _table(rows: list[dict]) -> str:
    lines = ["| input | dtype | max_pixels | visual tokens / item | s / item | tower s / item | tower share of time | "
             "tower share of FLOPs | vs first cap | vs float32 |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        vs_fp32 = "-" if r["x_float32"] is None else f"{r['x_float32']:.2f}x"
        lines.append(f"| {r['kind']} {r['size']} | {r['dtype']} | {r['max_pixels']:,} ({r['cap_tokens']} tokens) | "
                     f"{r['visual_tokens_per_item']:.0f} | {r['s_per_item']:.3f} | {r['tower_s_per_item']:.3f} | "
                     f"{r['tower_share_of_time']:.0%} | {r['tower_share_of_flops']:.0%} | {r['x_first_cap']:.2f}x | {vs_fp32} |")
    return "\n".join(lines)

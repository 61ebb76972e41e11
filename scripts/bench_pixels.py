"""The cost of resolution: seconds per photo and per page at several image pixel caps
(`index --max-pixels`), with the vision tower's share of the time and of the FLOPs.

Usage:
    python scripts/bench_pixels.py [--shape qwen3-vl-embedding-2b] [--scale-hidden 0.25] [--n 4]
        [--photo 640x480] [--page 1240x1754] [--max-pixels 1843200,1003520,501760,250880] [--repeats 2]

In ONE process, on the same generated inputs (noise photos; one-page text PDFs rendered as
`faste-mm bench --inputs page:WxH` does): per cap, the full forward through `Embedder.encode_documents`
(seconds per item end to end), then the vision tower alone (`Qwen3VLModel.get_image_features` on the
same serialized pixels); one warm-up per cap, then rounds that visit every cap in turn, medians over rounds. The tower
share of time = tower seconds / forward seconds; of FLOPs = `EmbedStats.flops_vision` / all.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from faste_mm import BatchingConfig, Embedder
from faste_mm.model.items import as_item
from faste_mm.model.serialization import PIXELS_PER_VISUAL_TOKEN, SerializerConfig
from faste_mm.tools.bench import device_name
from faste_mm.tools.bench_inputs import make_inputs
from faste_mm.tools.shapes import build_shape_model


def tower_s(embedder: Embedder, items: list) -> float:
    """The vision tower alone on each item's serialized pixels (one image per call, as a batch of
    photos of different sizes would run after the serializer)."""
    serialized = [embedder.serializer(as_item(item, i), None) for i, item in enumerate(items)]
    model = embedder.backbone.model

    started = time.perf_counter()
    with torch.inference_mode():
        for s in serialized:
            model.get_image_features(s.pixel_values, s.image_grid_thw, return_dict=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="qwen3-vl-embedding-2b")
    parser.add_argument("--scale-hidden", type=float, default=0.25)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--photo", default="640x480")
    parser.add_argument("--page", default="1240x1754")
    parser.add_argument("--max-pixels", default="1843200,1003520,501760,250880")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    caps = [int(c) for c in args.max_pixels.split(",")]
    with tempfile.TemporaryDirectory(prefix="faste-mm-pixels-") as work:
        path = build_shape_model(args.shape, Path(work) / "model", args.scale_hidden)
        base = Embedder.from_pretrained(str(path), device="cpu", dtype="float32",
                                        batching=BatchingConfig(batch_tokens=1 << 16))
        tokenizer = base.serializer.processor.tokenizer
        inputs = {"photo": make_inputs(f"image:{args.photo}", args.n, Path(work) / "photos", tokenizer),
                  "page": make_inputs(f"page:{args.page}", args.n, Path(work) / "pages", tokenizer)}
        print(f"{args.shape} at scale-hidden {args.scale_hidden:g}, float32, on {device_name(base.backbone.device)}; "
              f"{args.n} items per kind, median of {args.repeats} interleaved rounds after a warm-up")
        print("| input | max_pixels | visual tokens / item | s / item | tower s / item | tower share of time | "
              "tower share of FLOPs | vs official cap |")
        print("|---|---|---|---|---|---|---|---|")
        for kind, items in inputs.items():
            embedders = {cap: base.with_serializer(SerializerConfig(max_pixels=cap)) for cap in caps}
            runs = {cap: [] for cap in caps}
            towers = {cap: [] for cap in caps}
            stats = {}
            for cap, embedder in embedders.items():  # warm-up, and the stats (the same every run)
                stats[cap] = embedder.encode_documents(items).stats
            for _ in range(args.repeats):  # interleaved rounds: a load spike hits every cap alike
                for cap, embedder in embedders.items():
                    started = time.perf_counter()
                    embedder.encode_documents(items)
                    runs[cap].append((time.perf_counter() - started) / len(items))
                    towers[cap].append(tower_s(embedder, items) / len(items))
            official = statistics.median(runs[caps[0]])
            for cap in caps:
                seconds, tower = statistics.median(runs[cap]), statistics.median(towers[cap])
                s = stats[cap]
                tokens = sum(t * h * w // 4 for trace in s.batches for t, h, w in trace.image_grids)  # merge 2x2
                flops_share = s.flops_vision / (s.flops_full + s.flops_vision)
                size = args.photo if kind == "photo" else args.page
                print(f"| {kind} {size} | {cap:,} ({cap // PIXELS_PER_VISUAL_TOKEN} tokens) | {tokens / len(items):.0f} | "
                      f"{seconds:.3f} | {tower:.3f} | {tower / seconds:.0%} | {flops_share:.0%} | {official / seconds:.2f}x |",
                      flush=True)

if __name__ == "__main__":
    main()

"""Duplicate-patch removal stacked with FastE, side by side in ONE process with mirrored rounds:
pages per second of faste-mm's bfloat16 default (neither), with `--patch-dedup` (dedup), with
FastE (faste), with both, and of the official transformers forward (hf), on document-like
images the bench draws itself (`rendered_pages`: a text page with margins, a two-column paper
page, a slide, a search-page screenshot). The model is Qwen3-VL-Embedding-2B at its real width
and layer structure with random weights; --layers/--blocks shorten the depth as `bench cpu` does.

    faste-mm bench patch-dedup --layers 2 --blocks 2 --rounds 2 --out docs/bench/patch-dedup-cpu.json

Random weights never reach FastE's alignment threshold, so FastE compresses before a fixed layer
(--trigger-layer, default half the depth): the decoder work it removes is the real setting's
at that layer. One row per page kind, then the whole set ("all": total pages over total seconds).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from faste_mm.bench.options import add_device, add_dtype, add_model, add_rounds, add_workdir, names, scratch
from faste_mm.bench.rounds import mirrored_rounds
from faste_mm.bench.schema import SuiteRun
from faste_mm.model.official import OFFICIAL_MAX_PIXELS
from faste_mm.errors import ConfigError
from faste_mm.model.patch_dedup import PATCH_DEDUP_MODES, PatchDedupConfig

CONTENDERS = ("neither", "dedup", "faste", "both", "hf")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from faste_mm.bench.rendered_pages import PAGE_KINDS

    parser.add_argument("--layers", type=int, default=4, help="decoder layers of the built 2B-width model (default 4; the real one has 28)")
    parser.add_argument("--blocks", type=int, default=4, help="vision tower blocks of the built model (default 4; the real one has 24)")
    add_model(parser)
    add_device(parser, dtype=False)
    # bfloat16: the dtype faste-mm and transformers load the real checkpoint in
    add_dtype(parser, default="bfloat16")
    add_rounds(parser, default=2)
    parser.add_argument("--kinds", default=",".join(PAGE_KINDS), help=f"page kinds drawn by the bench (default {','.join(PAGE_KINDS)})")
    parser.add_argument("--n", type=int, default=1, help="pages of each kind (default 1)")
    parser.add_argument("--patch-dedup", dest="patch_dedup", default="exact", choices=PATCH_DEDUP_MODES[1:],
                        help="the dedup contenders' mode (default exact)")
    parser.add_argument("--r-max", dest="r_max", type=float, default=0.5, help="the FastE contenders' r_max (default 0.5)")
    parser.add_argument("--trigger-layer", dest="trigger_layer", type=int, default=None,
                        help="the layer FastE compresses before (default: half the depth; random weights never reach theta)")
    parser.add_argument("--contenders", default=",".join(CONTENDERS), help=f"among {', '.join(CONTENDERS)} (default all)")
    parser.add_argument("--max-pixels", dest="max_pixels", type=int, default=None,
                        help=f"resize each page to at most this many pixels (default {OFFICIAL_MAX_PIXELS}, the official cap)")
    parser.add_argument("--batch-size", dest="batch_size", type=int, default=1, help="pages per forward of the transformers path (default 1)")
    add_workdir(parser)


def run(args: argparse.Namespace) -> SuiteRun:
    with scratch(args.workdir, "bench-patch-dedup-") as work:
        return _run(args, work)


def _run(args: argparse.Namespace, work: Path) -> SuiteRun:
    from faste_mm import Embedder, FastEConfig
    from faste_mm.bench.cpu import build
    from faste_mm.bench.model import _hf_forward
    from faste_mm.bench.rendered_pages import PAGE_KINDS, render_pages

    contenders, kinds = names(args.contenders), names(args.kinds)
    if unknown := [c for c in contenders if c not in CONTENDERS] + [k for k in kinds if k not in PAGE_KINDS]:
        raise ConfigError(f"unknown contenders or kinds {', '.join(unknown)}; contenders: {', '.join(CONTENDERS)}; "
                          f"kinds: {', '.join(PAGE_KINDS)}")
    if "neither" not in contenders:
        raise ConfigError("--contenders must include neither: every speed-up is read against it")
    device = torch.device(args.device)
    model = args.model or build(work / "model", args.layers, args.blocks)
    embedder = Embedder.from_pretrained(str(model), device=device, dtype=args.dtype)
    if args.max_pixels is not None:
        embedder = embedder.with_serializer(replace(embedder.serializer.config, max_pixels=args.max_pixels))
    layers = embedder.backbone.shape.num_layers
    trigger = args.trigger_layer if args.trigger_layer is not None else layers // 2
    fast_e = FastEConfig(r_max=args.r_max, trigger_layer=trigger)
    dedup = PatchDedupConfig(args.patch_dedup)
    settings = {"neither": (None, None), "dedup": (None, dedup), "faste": (fast_e, None), "both": (fast_e, dedup)}
    pages = render_pages(work / "pages", kinds, args.n)
    rows = []
    for kind in kinds:
        inputs = pages[kind]
        runs = {name: (lambda f=f, d=d: embedder.encode_documents(inputs, fast_e=f, patch_dedup=d))
                for name, (f, d) in settings.items() if name in contenders}
        if "hf" in contenders:  # the official forward on the same model (the same loaded weights and dtype)
            runs["hf"] = _hf_forward(embedder, inputs, args.batch_size)
        timed = mirrored_rounds(runs, args.repeats, device=device)
        rows.append(_row(kind, len(inputs), timed))
    rows.append(_total(rows))
    params = {"model": str(args.model) if args.model else "qwen3-vl-embedding-2b (real width)", "layers": layers,
              "tower_blocks": len(embedder.backbone.model.visual.blocks), "rounds": args.repeats, "kinds": kinds,
              "n": args.n, "patch_dedup": dedup.mode, "r_max": args.r_max, "trigger_layer": trigger,
              "contenders": contenders, "torch_threads": torch.get_num_threads(), "load_after": os.getloadavg()}
    return SuiteRun(rows, params, _device_name(device), embedder.dtype_choice.name, {}, _table(rows, contenders))


def _row(kind: str, n: int, timed) -> dict:
    """One kind's pages/s per contender (median round), the ratios to neither and to transformers,
    the kept-patch share, and how close dedup's vectors stay to neither's (cosine: random weights,
    so a check that nothing broke, not a quality figure)."""
    seconds = {name: t.median for name, t in timed.items()}
    row = {"kind": kind, "pages": n, "seconds": seconds, "rounds_s": {name: list(t.seconds) for name, t in timed.items()},
           "pages_per_s": {name: n / s for name, s in seconds.items()}}
    row["x_neither"] = {name: seconds["neither"] / s for name, s in seconds.items()}
    if "hf" in seconds:
        row["x_hf"] = {name: seconds["hf"] / s for name, s in seconds.items()}
    for name in ("dedup", "both"):
        if name in timed:
            stats = timed[name].output.stats
            row.setdefault("patch_units", [stats.kept_image_units, stats.image_units])
            row.setdefault("patches_kept", stats.patches_kept)
            row.setdefault("tower_s", {})[name] = stats.tower_s
    if "neither" in timed:
        row.setdefault("tower_s", {})["neither"] = timed["neither"].output.stats.tower_s
    if "dedup" in timed:
        a, b = timed["neither"].output.embeddings, timed["dedup"].output.embeddings
        row["cosine_dedup_to_neither"] = float(np.min(np.sum(a * b, axis=1)))
    return row


def _total(rows: list[dict]) -> dict:
    """All kinds together: total pages over the summed median seconds, per contender."""
    pages = sum(row["pages"] for row in rows)
    seconds = {name: sum(row["seconds"][name] for row in rows) for name in rows[0]["seconds"]}
    total = {"kind": "all", "pages": pages, "seconds": seconds, "pages_per_s": {k: pages / s for k, s in seconds.items()},
             "x_neither": {k: seconds["neither"] / s for k, s in seconds.items()}}
    if "hf" in seconds:
        total["x_hf"] = {k: seconds["hf"] / s for k, s in seconds.items()}
    units = [row["patch_units"] for row in rows if "patch_units" in row]
    if units:
        total["patch_units"] = [sum(kept for kept, _ in units), sum(full for _, full in units)]
        total["patches_kept"] = total["patch_units"][0] / total["patch_units"][1]
    return total


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU x{os.cpu_count()} (torch threads {torch.get_num_threads()})"


def _table(rows: list[dict], contenders: list[str]) -> str:
    lines = ["pages/s, median of mirrored rounds (x neither; x transformers)",
             "| pages | kept | " + " | ".join(contenders) + " |", "|---|---:|" + "---:|" * len(contenders)]
    for row in rows:
        cells = []
        for name in contenders:
            ratio = f"{row['x_neither'][name]:.2f}x" + (f"; {row['x_hf'][name]:.2f}x hf" if "x_hf" in row else "")
            cells.append(f"{row['pages_per_s'][name]:.3f} ({ratio})")
        kept = f"{row['patches_kept']:.0%}" if "patches_kept" in row else "-"
        lines.append(f"| {row['kind']} x{row['pages']} | {kept} | " + " | ".join(cells) + " |")
    return "\n".join(lines)

"""Reranker speed, side by side in one process: the official path (transformers' own forward on
left-padded pairs + the official score formula), our full forward, and FastE at several r_max,
with and without protect="query". Random weights with a real reranker architecture (the 2B
shape: Qwen3-VL-Embedding-2B's decoder and vision tower plus an LM head), widths scaled for a CPU.

    faste-mm bench rerank --inputs text:600 --top 20,50 --scale-hidden 0.125
    faste-mm bench rerank --inputs page:640x900 --top 20 --scale-hidden 0.125 --tower-cache cold,warm

All settings run once per round, in mirrored order every other round (A..Z, Z..A), and the mean
over rounds is kept, so a drifting load on a shared machine cancels instead of favouring the
settings that run last. Rows (and a Markdown table): seconds per query (all
candidates), pairs/s, speed-up over our full forward and over the official path, max |score -
full score|, prefix kept, FastE's mean trigger layer, and the vision tower's share of the time
(FastE leaves the tower alone: it bounds the gain on photos and pages).
"""

from __future__ import annotations

import argparse
import re
import tempfile
from collections import Counter
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np
import torch

from faste_mm.model.backbones.registry import RERANK_FAMILIES
from faste_mm.model.batching import BatchingConfig
from faste_mm.model.faste import FastEConfig
from faste_mm.model.items import expand_items
from faste_mm.model.rerank.pair_format import rerank_serializer_config
from faste_mm.model.rerank.reranker import Reranker
from faste_mm.model.rerank.tower_cache import DEFAULT_TOWER_CACHE_BYTES
from faste_mm.bench.inputs import make_inputs
from faste_mm.bench.options import add_device, add_inputs, add_model, add_rounds, add_shape, add_threads, apply_threads, ints
from faste_mm.bench.rounds import mirrored_rounds
from faste_mm.bench.schema import SuiteRun
from faste_mm.model.cpu.machine import device_name
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
        on = {k: v.to(lm.device) for k, v in dict(input_ids=ids, attention_mask=mask, mm_token_type_ids=mm, **extra).items()}
        with torch.inference_mode():
            hidden = lm.model(**on).last_hidden_state[:, -1]
        out.append(torch.sigmoid(hidden.float() @ direction.float().to(lm.device)))
    return torch.cat(out).cpu().numpy()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_inputs(parser, "text:600")
    parser.add_argument("--top", default="20", help="candidates per query, comma-separated (default 20)")
    add_shape(parser, scale=0.125)
    add_model(parser, "reranker (Qwen3-VL with its LM head)")
    add_device(parser)
    parser.add_argument("--r-max", default="0.3,0.5,0.7", help="FastE settings (comma-separated; default 0.3,0.5,0.7)")
    parser.add_argument("--protect", default="none,query", help="protect modes run at each r_max (default none,query)")
    parser.add_argument("--trigger-layer", default="adaptive", help="FastE's trigger at each r_max: adaptive (the "
                        "alignment trigger, Algorithm 1) and/or fixed layers, comma-separated (e.g. adaptive,8,10); "
                        "fixed rows are labelled 'fixed@L' (default adaptive)")
    parser.add_argument("--prefix-reuse", default="off,on", help="prefix reuse modes run at each setting (off, on; default both)")
    parser.add_argument("--tower-cache", default="off", help="tower cache modes for image inputs: off (no cache), "
                        "cold (emptied before every query), warm (filled by an untimed query first; the candidates' resized images are kept with it); comma-separated (default off)")
    parser.add_argument("--max-pixels", type=int, default=None, help="image / page pixel budget of every setting "
                        "(default: the official reranker's 1,310,720); smaller budgets make page runs fit a CPU")
    parser.add_argument("--drop", default=None, help="a regular expression: settings whose name it matches are not run")
    parser.add_argument("--official-batch", type=int, default=8, help="pairs per padded batch on the official path (default 8)")
    add_rounds(parser, default=2)
    add_threads(parser)


def run(args: argparse.Namespace) -> SuiteRun:
    apply_threads(args)
    tops = ints(args.top)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = args.model or build_reranker_shape(Path(tmp) / f"{args.shape}-reranker", args.shape, args.scale_hidden)
        serializer = None
        if args.max_pixels is not None:
            serializer = replace(rerank_serializer_config(RERANK_FAMILIES["qwen3_vl"].max_length), max_pixels=args.max_pixels)
        full = Reranker.from_pretrained(str(path), device=args.device, dtype=args.dtype, batching=BatchingConfig(workers=1),
                                        prefix_reuse=False, tower_cache_bytes=0, serializer=serializer)
        from transformers import AutoTokenizer, Qwen3VLForConditionalGeneration

        # the official path in the dtype our "auto" resolved to: the race is the runner's, not the dtype's
        lm = Qwen3VLForConditionalGeneration.from_pretrained(str(path), dtype=full.backbone.dtype).to(full.backbone.device).eval()
        all_documents = make_inputs(args.inputs, max(tops), Path(tmp) / "inputs", AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir())))
        settings = [(OFFICIAL, None), (FULL, full)]
        caches = args.tower_cache.split(",")
        # the warm settings are variants of one reranker: one tower cache (and the resized images kept with it),
        # filled below by another query over the same candidates
        warm_base = Reranker(full.loaded, batching=full.batching, serializer=full.serializer.config, prefix_reuse=False)
        for r_max in [0.0] + [float(r) for r in args.r_max.split(",")]:
            for protect, trigger in [("none", "adaptive")] if r_max == 0 else [
                    (p, t) for p in args.protect.split(",") for t in args.trigger_layer.split(",")]:
                fixed = None if trigger == "adaptive" else int(trigger)
                for reuse in args.prefix_reuse.split(","):
                    for cache in caches:
                        if r_max == 0 and reuse == "off" and cache == "off":
                            continue  # FULL itself
                        fast_e = FastEConfig(r_max=r_max, trigger_layer=fixed)
                        if cache == "warm":
                            rr = warm_base.variant(fast_e=fast_e, protect=protect, prefix_reuse=reuse == "on")
                        else:
                            rr = Reranker(full.loaded, fast_e=fast_e, protect=protect, batching=full.batching,
                                          serializer=full.serializer.config, prefix_reuse=reuse == "on",
                                          tower_cache_bytes=0 if cache == "off" else DEFAULT_TOWER_CACHE_BYTES)
                        name = "full" if r_max == 0 else f"FastE r={r_max}" + ("" if fixed is None else f" fixed@{fixed}")
                        name += " protect=query" if protect == "query" else ""
                        name += " +reuse" if reuse == "on" else ""
                        name += "" if cache == "off" else f" cache={cache}"
                        settings.append((name, rr))
        if args.drop:
            settings = [(name, rr) for name, rr in settings if name in (OFFICIAL, FULL) or not re.search(args.drop, name)]
        full.score(QUERY, all_documents[:2])  # untimed warm-up: lazy kernel set-up is no setting's cost
        if any(name.endswith("cache=warm") for name, _ in settings):
            warm_base.score("an earlier query about the same candidates", all_documents[: max(tops)])
        device, dtype = device_name(full.backbone.device), str(full.backbone.dtype).removeprefix("torch.")
        max_pixels = full.serializer.config.max_pixels
        cold = {id(rr): name.endswith("cache=cold") for name, rr in settings}
        for top in tops:
            documents = all_documents[:top]

            def score_once(reranker, documents=documents):
                if reranker is None:
                    return official_scores(lm, full, documents, args.official_batch), None
                if cold[id(reranker)]:  # a cold cache: every candidate is resized and its tower runs (hashed and kept)
                    reranker.tower_cache.clear()
                    reranker.resized_images.clear()
                result = reranker.score(QUERY, documents)
                return result.scores, result.stats

            # the mean of mirrored rounds (an even count cancels a linear load drift); no extra warm-up
            timed = mirrored_rounds({name: partial(score_once, rr) for name, rr in settings}, args.repeats, warmup=0,
                                    device=full.backbone.device)
            reference, full_s, official_s = timed[FULL].output[0], timed[FULL].mean, timed[OFFICIAL].mean
            for name, _ in settings:
                seconds, (scores, stats) = timed[name].mean, timed[name].output
                rows.append({"top": top, "setting": name, "s_per_query": seconds, "pairs_per_s": top / seconds,
                             "x_full": full_s / seconds, "x_official": official_s / seconds,
                             "max_abs_score_diff_vs_full": float(np.max(np.abs(scores - reference))), **describe(stats)})
    params = {"inputs": args.inputs, "top": tops, "shape": args.shape, "scale_hidden": args.scale_hidden,
              "max_pixels": max_pixels, "query_words": len(QUERY.split()), "repeats": args.repeats,
              "official_batch": args.official_batch}
    return SuiteRun(rows, params, device, dtype, text=_table(rows))


def _table(rows: list[dict]) -> str:
    lines = ["| top | setting | s / query | pairs/s | vs our full | vs official | max abs score diff vs full "
             "| prefix kept | trigger layer | tower share | trigger layers (batches) | decoder s | prep s | model idle s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cell = lambda key, fmt: "-" if r[key] is None else format(r[key], fmt)  # noqa: E731
        lines.append(f"| {r['top']} | {r['setting']} | {r['s_per_query']:.2f} | {r['pairs_per_s']:.2f} | {r['x_full']:.2f}x | "
                     f"{r['x_official']:.2f}x | {r['max_abs_score_diff_vs_full']:.1e} | {r['prefix_kept']:.0%} | "
                     f"{cell('trigger_layer', '.1f')} | {cell('tower_share', '.0%')} | {r['trigger_histogram'] or '-'} | "
                     f"{cell('decoder_s', '.2f')} | {cell('prep_s', '.2f')} | {cell('idle_s', '.2f')} |")
    return "\n".join(lines)


OFFICIAL, FULL = "official (HF forward, padded)", "faste-mm full"


def describe(stats) -> dict:
    """prefix kept | mean trigger layer | the vision tower's share of the forward's seconds |
    the trigger layers' histogram over batches (layer x batches; "none" where a batch never
    compressed) | the decoder's seconds (prefix included) | seconds serializing the pairs
    (decoding, resizing and patching each page: worker threads, overlapped with the model) | the
    seconds of the call the model thread spent outside the forward (waiting for the first
    serialized batch, hashing, bookkeeping), all of the last round. The official path: None."""
    if stats is None:
        return {"prefix_kept": 1.0, "trigger_layer": None, "tower_share": None, "trigger_histogram": None,
                "decoder_s": None, "prep_s": None, "idle_s": None}
    kept = stats.kept_prefix_tokens / stats.prefix_tokens if stats.prefix_tokens else 1.0
    triggers = [b.trigger_layer for b in stats.batches if b.trigger_layer is not None]
    tower = sum(b.tower_s for b in stats.batches)
    total = tower + sum(b.decoder_s for b in stats.batches) + stats.prefix_s
    counts = Counter("none" if b.trigger_layer is None else b.trigger_layer for b in stats.batches)
    histogram = " ".join(f"{layer}x{n}" for layer, n in sorted(counts.items(), key=lambda kv: (kv[0] == "none", str(kv[0]).zfill(3))))
    return {"prefix_kept": kept, "trigger_layer": sum(triggers) / len(triggers) if triggers else None,
            "tower_share": tower / total if total else 0.0, "trigger_histogram": None if stats.fast_e is None else histogram,
            "decoder_s": sum(b.decoder_s for b in stats.batches) + stats.prefix_s, "prep_s": stats.serialize_s,
            "idle_s": stats.elapsed_s - stats.forward_s - stats.prefix_s}

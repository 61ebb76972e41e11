"""faste-mm side by side with what users would run instead, in ONE process, interleaved, on the same
inputs: 640x480 JPEG photos, one-page PDFs at the pixel cap and 1k-token texts, through

  faste-mm        the defaults of `faste-mm index`: dtype "auto" (bfloat16 where the CPU has native
                  bf16), FastE r_max 0.5 on documents, the packed vision tower
  faste-mm fp32   the same with --dtype float32
  faste-mm plan   dtype "auto" at a plan's setting: `--plan plan.json[:ROW]` (its pixel cap, FastE
                  and dtype), else `--plan-setting` (default 501,760 px, r_max 0.5: a candidate of
                  `faste-mm plan`'s default grid; random weights make any plan's agreement moot)
  official        transformers' Qwen3VLModel + processor driven as the official Qwen3VLEmbedder
                  drives them (config dtype, which is bfloat16 for the published checkpoints; right-
                  padded batches; last token of last_hidden_state; L2 norm), with our own code
  st              sentence-transformers loading the same local directory, on texts (last-token
                  pooling + normalisation from a modules.json, as Qwen3-Embedding checkpoints ship;
                  without one, ST 6.2 loads a Qwen3-VL directory for text/image/video but mean-pools)

plus the vision tower alone: transformers' Qwen3VLVisionModel against faste-mm's packed tower on
each kind's pixels. A random-weight model of a real shape (faste_mm.tools.shapes), stored in
bfloat16 like the published checkpoint. Usage (a few minutes of CPU at scale 0.25):

  faste-mm bench peers --scale-hidden 0.25 --photos 4 --pages 2 --texts 4 --repeats 2 --out peers.json

At the real shape (--scale-hidden 1) `--share-weights` keeps ONE copy of the weights: the official
path runs on faste-mm's bfloat16 model, and "faste-mm fp32" casts that model to float32 for its turn
and back (bfloat16 -> float32 -> bfloat16 is exact), so three peers fit in ~2x the bf16 weights.
`--threads N` sets torch's threads for every peer alike (on an oversubscribed machine one thread
avoids the OpenMP barrier waits that inflate every small op; say which in the table).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import random
import statistics
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

from faste_mm import BatchingConfig, Embedder, FastEConfig, Item
from faste_mm.bench.inputs import make_inputs
from faste_mm.bench.options import add_device, add_rounds, add_threads, apply_threads, names
from faste_mm.bench.rounds import mirrored_rounds
from faste_mm.bench.schema import SuiteRun
from faste_mm.model.backbones.loading import choose_dtype, read_cpu_flags
from faste_mm.model.cpu.machine import device_name
from faste_mm.model.backbones.vision_tower import PackedVisionTower
from faste_mm.model.serialization import SerializerConfig
from faste_mm.model.items import expand_items
from faste_mm.tools.shapes import SHAPES, build_shape_model, write_sentence_transformers_layout

log = logging.getLogger(__name__)

DOCUMENT_R_MAX = 0.5  # `faste-mm index`'s default for documents


def write_photos(folder: Path, n: int) -> list[Path]:
    """n 640x480 JPEGs (shapes over noise, so decoding costs what a photo costs)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    paths = []
    for i in range(n):
        image = Image.effect_noise((640, 480), 60).convert("RGB")
        draw = ImageDraw.Draw(image)
        for _ in range(12):
            x, y = rng.randrange(600), rng.randrange(440)
            draw.ellipse((x, y, x + rng.randrange(20, 200), y + rng.randrange(20, 200)), fill=tuple(rng.randrange(256) for _ in range(3)))
        paths.append(folder / f"photo_{i:03d}.jpg")
        image.save(paths[-1], quality=90)
    return paths


class FasteMM:
    """faste-mm's `encode_documents` at one setting. `embedder` given: share its weights, cast to
    `cast` for this peer's turn only (and back: bfloat16 -> float32 -> bfloat16 is exact)."""

    def __init__(self, model_dir: Path, dtype: str, device: str, fast_e: FastEConfig | None = None,
                 max_pixels: int | None = None, embedder: Embedder | None = None, cast: torch.dtype | None = None) -> None:
        embedder = embedder or Embedder.from_pretrained(str(model_dir), device=device, dtype=dtype,
                                                        batching=BatchingConfig(batch_tokens=16384))
        self.embedder = embedder if max_pixels is None else embedder.with_serializer(SerializerConfig(max_pixels=max_pixels))
        self.fast_e = fast_e or FastEConfig(r_max=DOCUMENT_R_MAX)
        self.cast = cast
        self.split = (0.0, 0.0)

    @property
    def dtype(self) -> torch.dtype:
        return self.cast or self.embedder.backbone.dtype

    @contextlib.contextmanager
    def turn(self):
        """The model in this peer's dtype for the duration (a no-op without `cast`)."""
        model = self.embedder.backbone.model
        original = self.embedder.backbone.dtype
        if self.cast is not None and self.cast != original:
            model.to(self.cast)
        try:
            yield model
        finally:
            if self.cast is not None and self.cast != original:
                model.to(original)

    def encode(self, inputs: list) -> np.ndarray:
        with self.turn():
            result = self.embedder.encode_documents(inputs, fast_e=self.fast_e)
        self.split = (result.stats.tower_s, result.stats.decoder_s)
        return result.embeddings


class Official:
    """The official embedder's steps (src/models/qwen3_vl_embedding.py): the model loaded with no
    dtype (transformers 5: the config's), the processor with right padding, one padded call per
    batch, `do_resize=False` after qwen-vl-utils' resize, last valid token, L2 norm."""

    def __init__(self, model_dir: Path, serializer, batch_size: int, device: str, model=None) -> None:
        from transformers import Qwen3VLModel, Qwen3VLProcessor

        self.model = model if model is not None else Qwen3VLModel.from_pretrained(str(model_dir)).to(device).eval()
        self.processor = Qwen3VLProcessor.from_pretrained(str(model_dir), padding_side="right")
        self.serializer = serializer  # the official prompt and resize (checked equal in tests)
        self.batch_size = batch_size
        self.split = (0.0, 0.0)

    @torch.inference_mode()
    def encode(self, inputs: list) -> np.ndarray:
        vectors = []
        for start in range(0, len(inputs), self.batch_size):
            items = [value if isinstance(value, Item) else Item(text=value) for value in inputs[start:start + self.batch_size]]
            prompts = [self.serializer.render_prompt(item, None) for item in items]
            images = [self.serializer.prepare_image(item) for item in items if item.has_image] or None
            batch = self.processor(text=prompts, images=images, padding=True, do_resize=False, return_tensors="pt")
            batch = batch.to(self.model.device)
            hidden = self.model(**batch).last_hidden_state
            last = batch["attention_mask"].sum(dim=1) - 1
            vectors.append(torch.nn.functional.normalize(hidden[torch.arange(len(items)), last], dim=-1).float().cpu().numpy())
        return np.concatenate(vectors)


class SentenceTransformersPeer:
    def __init__(self, model_dir: Path, serializer, batch_size: int, device: str) -> None:
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(str(model_dir), device=device)
        self.serializer = serializer
        self.batch_size = batch_size
        self.split = (0.0, 0.0)

    def encode(self, inputs: list) -> np.ndarray:
        texts = [self.serializer.render_prompt(Item(text=value), None) for value in inputs]  # the official prompt
        return self.model.encode(texts, batch_size=self.batch_size, normalize_embeddings=True, convert_to_numpy=True)


def tower_pixels(serializer, inputs: list):
    """The processor's pixel patches and grids of a kind's images (None for texts)."""
    images = [serializer.prepare_image(item) for item in inputs if isinstance(item, Item) and item.has_image]
    if not images:
        return None
    batch = serializer.processor.image_processor(images=images, do_resize=False, return_tensors="pt")
    return batch["pixel_values"], batch["image_grid_thw"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shape", default="qwen3-vl-embedding-2b", choices=[s for s in SHAPES if "vl" in s],
                        help="random-weight real architecture (default qwen3-vl-embedding-2b)")
    parser.add_argument("--scale-hidden", "--scale", dest="scale_hidden", type=float, default=0.25,
                        help="shrink the shape's widths by this factor (default 0.25; 1 = the real width)")
    parser.add_argument("--photos", type=int, default=4, help="640x480 JPEG photos (default 4)")
    parser.add_argument("--pages", type=int, default=2, help="one-page PDFs at the cap (default 2)")
    parser.add_argument("--texts", type=int, default=4, help="texts (default 4)")
    parser.add_argument("--text-tokens", type=int, default=1000, help="tokens per text (default 1000)")
    add_rounds(parser, default=2)
    parser.add_argument("--batch-size", type=int, default=8, help="items per padded call (official, st; default 8)")
    parser.add_argument("--peers", default="faste-mm,faste-mm fp32,faste-mm plan,official,st", help="peers, comma-separated (default all)")
    parser.add_argument("--plan", help="plan.json[:ROW] whose setting the 'faste-mm plan' peer runs")
    parser.add_argument("--plan-setting", default="501760,0.5", help="MAX_PIXELS,R_MAX for 'faste-mm plan' without --plan (default 501760,0.5)")
    parser.add_argument("--share-weights", action="store_true", help="one copy of the weights (see the suite's docstring)")
    add_threads(parser)
    add_device(parser, dtype=False)


def run(args: argparse.Namespace) -> SuiteRun:
    peers_wanted = names(args.peers)
    apply_threads(args)
    with tempfile.TemporaryDirectory(prefix="faste-mm-peers-") as workdir:
        work = Path(workdir)
        model_dir = build_shape_model(args.shape, work / "model", args.scale_hidden, torch.bfloat16)
        write_sentence_transformers_layout(model_dir, SHAPES[args.shape].hidden if args.scale_hidden == 1 else
                                           json.loads((model_dir / "config.json").read_text())["text_config"]["hidden_size"])
        peers = {}
        base = FasteMM(model_dir, "auto", args.device)  # the defaults; other peers may share its weights
        plan_label, plan_dtype, plan_kwargs = plan_setting(args)
        for name in peers_wanted:
            if name == "faste-mm":
                peers[name] = base
            elif name == "faste-mm fp32":
                peers[name] = (FasteMM(model_dir, "float32", args.device, embedder=base.embedder, cast=torch.float32)
                               if args.share_weights else FasteMM(model_dir, "float32", args.device))
            elif name == "faste-mm plan":
                shared = args.share_weights or plan_dtype == "auto"
                peers[name] = FasteMM(model_dir, plan_dtype, args.device, embedder=base.embedder if shared else None,
                                      cast=torch.float32 if shared and plan_dtype == "float32" else None, **plan_kwargs)
        serializer = base.embedder.serializer
        for name in peers_wanted:
            if name == "official":
                shared = base.embedder.backbone.model if args.share_weights and base.dtype == torch.bfloat16 else None
                peers[name] = Official(model_dir, serializer, args.batch_size, args.device, model=shared)
            elif name == "st":
                peers[name] = SentenceTransformersPeer(model_dir, serializer, args.batch_size, args.device)
        tokenizer = serializer.processor.tokenizer
        kinds = {  # cheapest first, so a run cut short still reports the early kinds
            f"texts ({args.text_tokens} tokens)": make_inputs(f"text:{args.text_tokens}", args.texts, work, tokenizer),
            "photos 640x480 JPEG": [Item(image=p) for p in write_photos(work / "photos", args.photos)],
            "pages (one-page PDF, at the cap)": expand_items(make_inputs("page:1240x1754", args.pages, work / "pages", tokenizer))[0],
        }
        kinds = {k: v for k, v in kinds.items() if v}
        device = torch.device(args.device)
        auto = choose_dtype("auto", device, torch.bfloat16, read_cpu_flags)
        report = {"device": device_name(device), "shape": args.shape, "scale_hidden": args.scale_hidden,
                  "faste_mm_auto_dtype": auto.to_dict(), "official_dtype": str(peers["official"].model.dtype) if "official" in peers else None,
                  "threads": torch.get_num_threads(), "plan_setting": plan_label, "share_weights": args.share_weights,
                  "repeats": args.repeats, "kinds": {}}
        for kind, inputs in kinds.items():
            # With a last-token modules.json, ST loads this directory as a text model: texts only.
            runnable = {name: peer for name, peer in peers.items()
                        if name != "st" or all(isinstance(v, str) for v in inputs)}
            # a warm-up round, then peers interleaved in mirrored order; each call: (vectors, (tower s, decoder s))
            timed = mirrored_rounds({name: (lambda peer=peer: (peer.encode(inputs), peer.split))
                                     for name, peer in runnable.items()}, args.repeats, device=args.device)
            vectors = {name: t.output[0] for name, t in timed.items()}
            rows = {}
            for name, t in timed.items():
                tower = statistics.median(split[0] for _, split in t.outputs)
                decoder = statistics.median(split[1] for _, split in t.outputs)
                row = {"items_per_s": len(inputs) / t.median, "seconds": list(t.seconds), "tower_s": tower,
                       "decoder_s": decoder}
                for reference in ("official", "faste-mm fp32"):
                    if reference in vectors and reference != name:
                        cos = (vectors[name] * vectors[reference]).sum(axis=1)
                        row[f"min_cos_vs_{reference}"] = float(cos.min())
                        row[f"mean_cos_vs_{reference}"] = float(cos.mean())
                rows[name] = row
            for name, row in rows.items():
                for reference in ("official", "faste-mm fp32", "st"):
                    if reference in rows:
                        row[f"x_{reference}"] = row["items_per_s"] / rows[reference]["items_per_s"]
            report["kinds"][kind] = {"items": len(inputs), "peers": rows, "tower": tower_race(peers, serializer, inputs, args.repeats)}
            log.info("%s", json.dumps({kind: report["kinds"][kind]}, indent=1))
    rows = [{"kind": kind, "items": data["items"], "peer": name, **row}
            for kind, data in report["kinds"].items() for name, row in data["peers"].items()]
    params = {key: value for key, value in report.items() if key not in ("kinds", "device")}
    params["tower"] = {kind: data["tower"] for kind, data in report["kinds"].items()}
    return SuiteRun(rows, params, report["device"], report["faste_mm_auto_dtype"]["dtype"], text=tables(report))




def tower_race(peers, serializer, inputs, repeats) -> dict:
    """transformers' Qwen3VLVisionModel vs the packed tower on the same pixels, interleaved, in each
    faste-mm peer's dtype: median seconds and the largest difference of the merged features."""
    pixels = tower_pixels(serializer, inputs)
    if pixels is None:
        return {}
    race = {}
    for name in ("faste-mm", "faste-mm fp32"):
        if name not in peers or str(peers[name].dtype).removeprefix("torch.") in race:  # "auto" chose float32: raced once
            continue
        with peers[name].turn() as model:
            race.update(_race_tower(model.visual, pixels, repeats))
    return race


def _race_tower(visual, pixels, repeats) -> dict:
    """One dtype's race (the tower's current dtype); the two go first in alternate rounds."""
    dtype = visual.patch_embed.proj.weight.dtype
    device = visual.patch_embed.proj.weight.device
    packed = PackedVisionTower(visual)
    values, grids = pixels[0].to(device, dtype), pixels[1].to(device)
    towers = {"transformers": lambda: visual(values, grid_thw=grids, return_dict=True).pooler_output,
              "packed": lambda: packed(values, grids).merged}
    with torch.inference_mode():
        timed = mirrored_rounds(towers, repeats, device=device)
    hf, ours_s = timed["transformers"].median, timed["packed"].median
    diff = float((timed["transformers"].output - timed["packed"].output).abs().max())
    return {str(dtype).removeprefix("torch."): {"transformers_s": hf, "packed_s": ours_s, "speedup": hf / ours_s,
                                                "max_abs_diff": diff}}


def plan_setting(args) -> tuple[str, str, dict]:
    """The 'faste-mm plan' peer's setting: (label, dtype, FasteMM keyword arguments)."""
    if args.plan:
        from faste_mm.tools.plan_report import load_plan

        report, row = load_plan(args.plan)
        chosen = report.row(row)
        settings = report.settings(row)
        fast_e = FastEConfig(r_max=chosen.r_max, threshold=settings.get("threshold"), warmup_layer=settings.get("warmup_layer"),
                             trigger_layer=settings.get("trigger_layer"))
        return (f"{args.plan}: {chosen.max_pixels:,} px, r_max {chosen.r_max:g}, {chosen.dtype}", chosen.dtype,
                {"fast_e": fast_e, "max_pixels": chosen.max_pixels})
    cap, r_max = args.plan_setting.split(",")
    return (f"{int(cap):,} px, r_max {float(r_max):g}, auto", "auto",
            {"fast_e": FastEConfig(r_max=float(r_max)), "max_pixels": int(cap)})


def tables(report: dict) -> str:
    lines = []
    """The peers and tower tables in Markdown."""
    lines.append(f"\n{report['device']}; {report['shape']} at scale-hidden {report['scale_hidden']}; faste-mm auto dtype: "
          f"{report['faste_mm_auto_dtype']['dtype']} ({report['faste_mm_auto_dtype']['reason']}); official dtype: {report['official_dtype']}; "
          f"torch threads {report['threads']}; plan peer: {report['plan_setting']}\n")
    lines.append("| inputs | peer | items/s | x official | x faste-mm fp32 | x st | tower s / decoder s | cos vs official (min) | cos vs faste-mm fp32 mean (min) |")
    lines.append("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for kind, data in report["kinds"].items():
        for name, row in data["peers"].items():
            def ratio(key):
                return f"{row[key]:.2f}x" if key in row else "-"
            split = f"{row['tower_s']:.2f} / {row['decoder_s']:.2f}" if row["tower_s"] or row["decoder_s"] else "-"
            cos = f"{row['min_cos_vs_official']:.4f}" if "min_cos_vs_official" in row else "-"
            fp32 = (f"{row['mean_cos_vs_faste-mm fp32']:.4f} ({row['min_cos_vs_faste-mm fp32']:.4f})"
                    if "mean_cos_vs_faste-mm fp32" in row else "-")
            lines.append(f"| {kind} x{data['items']} | {name} | {row['items_per_s']:.3f} | {ratio('x_official')} | "
                  f"{ratio('x_faste-mm fp32')} | {ratio('x_st')} | {split} | {cos} | {fp32} |")
    lines.append("\n| inputs | dtype | transformers tower s | packed tower s | packed speedup | max abs diff |")
    lines.append("|---|---|---:|---:|---:|---:|")
    for kind, data in report["kinds"].items():
        for dtype, row in data["tower"].items():
            lines.append(f"| {kind} | {dtype} | {row['transformers_s']:.3f} | {row['packed_s']:.3f} | {row['speedup']:.2f}x | {row['max_abs_diff']:.1e} |")
    return "\n".join(lines)

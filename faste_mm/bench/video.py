"""Video on a CPU shared with other jobs: full forward vs FastE on one synthetic clip, timed in
interleaved rounds (full, r=0.5, r=0.7, full, ...) and reported as the minimum per setting, so
load from other processes cancels instead of favouring whichever setting ran in a quiet moment.
Preprocessing is timed the same way, split into PyAV decoding (+seeking) and the official resize,
and the rest of serialization (processor, MRoPE positions).

    faste-mm bench video --seconds 30 120 --scale-hidden 0.25 --rounds 3 --out out.json
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path

import torch

from faste_mm.bench.options import add_model, add_rounds, add_shape
from faste_mm.bench.schema import SuiteRun

log = logging.getLogger(__name__)


def _min_time(fn, rounds: list[float]) -> None:
    started = time.perf_counter()
    fn()
    rounds.append(time.perf_counter() - started)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, nargs="+", default=[30, 120], help="clip lengths in seconds (default 30 120)")
    add_shape(parser, scale=0.25)
    add_model(parser)
    add_rounds(parser, default=3)
    parser.add_argument("--trigger-layer", type=int, default=10, help="FastE's fixed trigger layer (default 10)")


def run(args: argparse.Namespace) -> SuiteRun:
    from faste_mm import BatchingConfig, Embedder, FastEConfig, Item
    from faste_mm.model.ablations import Full
    from faste_mm.model.faste import FastE
    from faste_mm.model.flops import batch_flops, full_batch_flops, vision_flops
    from faste_mm.model.runner import run_decoder, settle_kernel
    from faste_mm.model.video import VideoConfig, read_video
    from faste_mm.bench.inputs import make_inputs
    from faste_mm.tools.shapes import build_shape_model
    import faste_mm.model.video as video

    report = {"clips": {}}
    with tempfile.TemporaryDirectory() as workdir:
        model = args.model or build_shape_model(args.shape, Path(workdir) / "model", args.scale_hidden, torch.float32)
        emb = Embedder.from_pretrained(str(model), device="cpu", batching=BatchingConfig(workers=0))
        backbone, layers = emb.backbone, emb.backbone.shape.num_layers
        for seconds in args.seconds:
            (clip,) = make_inputs(f"video:{seconds:g}", 1, Path(workdir) / "clips", None)
            item = Item(video=clip)
            (batch,) = list(emb.prepare_batches([item], [0]))
            policies = {"full": Full()}
            for r in (0.5, 0.7):
                config = emb.resolve_fast_e(FastEConfig(r_max=r, trigger_layer=args.trigger_layer))
                policies[f"faste r={r:g}"] = FastE(config, layers)
            times = {name: [] for name in policies}
            prep = {"decode_s": [], "resize_s": [], "serialize_s": []}
            traces = {}
            frames = read_video(clip, VideoConfig())
            for _ in range(args.repeats):
                for name, policy in policies.items():
                    kernel = settle_kernel(backbone, batch, policy, emb.unpadded)
                    _min_time(lambda: traces.__setitem__(name, run_decoder(backbone, batch, policy, kernel)[1]), times[name])
                _min_time(lambda: read_video(clip, VideoConfig()), prep["decode_s"])
                _min_time(lambda: [video._resize(f.permute(1, 2, 0).to(torch.uint8).numpy(), *f.shape[-2:]) for f in frames.frames], prep["resize_s"])
                _min_time(lambda: backbone.with_positions(emb.serializer(item, None)), prep["serialize_s"])
            grids = list(batch.video_grids)
            vision = vision_flops(backbone.vision_shape, grids)
            full_trace = traces["full"]
            full_flops = full_batch_flops(backbone.shape, 1, full_trace.padded_lengths[0])
            settings = {}
            for name, trace in traces.items():
                realised = batch_flops(backbone.shape, 1, trace.padded_lengths)
                settings[name] = {
                    "forward_s_min": min(times[name]), "forward_s_all": times[name],
                    "prefix_tokens": trace.prefix_tokens, "kept_prefix_tokens": trace.kept_prefix_tokens,
                    "decoder_flops": realised, "flops_with_vision": realised + vision,
                    "flops_reduction_with_vision": 1 - (realised + vision) / (full_flops + vision),
                }
            serialize = min(prep["serialize_s"])
            for values in settings.values():
                values["e2e_s_min"] = serialize + values["forward_s_min"]  # one item: no overlap to hide it
                values["decode_share_of_e2e"] = min(prep["decode_s"]) / values["e2e_s_min"]
            report["clips"][f"{seconds:g}s"] = {
                "frames": len(frames.indices), "video_grid_thw": grids, "visual_tokens": int((batch.input_ids == backbone.video_token_id).sum()),
                "tokens": int(batch.lengths[0]), "vision_flops": vision,
                "decode_s_min": min(prep["decode_s"]), "resize_s_min (inside decode)": min(prep["resize_s"]),
                "serialize_s_min (decode + processor + positions)": serialize, "settings": settings,
            }
            log.info("%s", json.dumps(report["clips"][f"{seconds:g}s"], indent=1))
    rows = [{"clip": clip, "setting": name, **{k: v for k, v in data.items() if k != "settings"}, **values}
            for clip, data in report["clips"].items() for name, values in data["settings"].items()]
    text = "\n".join(["| clip | frames | tokens | setting | forward s (min) | e2e s (min) | decode share of e2e | FLOPs reduction with vision |",
                      "|---|---:|---:|---|---:|---:|---:|---:|",
                      *(f"| {r['clip']} | {r['frames']} | {r['tokens']} | {r['setting']} | {r['forward_s_min']:.3f} | "
                        f"{r['e2e_s_min']:.3f} | {r['decode_share_of_e2e']:.0%} | {r['flops_reduction_with_vision']:.1%} |" for r in rows)])
    params = {"model": str(args.model) if args.model else None, "shape": args.shape, "scale_hidden": args.scale_hidden, "trigger_layer": args.trigger_layer,
              "repeats": args.repeats, "seconds": args.seconds, "statistic": "minimum over interleaved rounds"}
    return SuiteRun(rows, params, "cpu", "float32", text=text)


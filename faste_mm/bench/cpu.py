"""The CPU figures of docs/cpu.md, side by side in ONE process with mirrored rounds: for pages,
photos and texts at the real Qwen3-VL-Embedding-2B width (random weights, fewer layers and tower
blocks than the real 28/24 when --layers/--blocks say so: per-layer rates are what the ratios
compare), faste-mm in float32, in bfloat16 (tower attention dtype by trial), in bfloat16 with the
old float32-attention rule, in int8, and the official transformers forward; plus the GEMM rates,
each stage's fraction of them, and the FastE check's cost. One row per input kind.

    faste-mm bench cpu --layers 4 --blocks 4 --rounds 2 --out docs/bench/cpu-amx-2b-width.json

`--model DIR` measures a local checkpoint instead of building the 2B-width one.
"""

from __future__ import annotations

import argparse
import os
import statistics
from dataclasses import replace
from pathlib import Path

import torch

from faste_mm.bench.options import add_model, add_rounds, add_workdir, names, scratch
from faste_mm.bench.rounds import mirrored_rounds
from faste_mm.bench.schema import SuiteRun
from faste_mm.errors import ConfigError

# "-mlp-separate": the decoder MLP forced to transformers' modules (the fused one's baseline)
SETTINGS = ("float32", "float32-mlp-separate", "bfloat16", "bfloat16-attn-fp32", "bfloat16-mlp-separate", "int8", "hf")
DEFAULT_SETTINGS = ("float32", "bfloat16", "bfloat16-attn-fp32", "int8", "hf")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--layers", type=int, default=4, help="decoder layers of the built 2B-width model (default 4; the real one has 28)")
    parser.add_argument("--blocks", type=int, default=4, help="vision tower blocks of the built model (default 4; the real one has 24)")
    add_model(parser)
    add_rounds(parser, default=2)
    parser.add_argument("--kinds", default="page:1240x1754:1,image:640x480:2,text:1000:4",
                        help="KIND:SIZE:N,... (page and image WxH, text TOKENS; a page is the page-sized image faste-mm "
                             "renders; default page:1240x1754:1,image:640x480:2,text:1000:4)")
    parser.add_argument("--settings", default=",".join(DEFAULT_SETTINGS),
                        help=f"contenders among {', '.join(SETTINGS)} (float32 is the baseline, always needed; default {','.join(DEFAULT_SETTINGS)})")
    add_workdir(parser)


def build(path: Path, layers: int, blocks: int) -> Path:
    """A random-weight Qwen3-VL-Embedding-2B at the real width with `layers` decoder layers and
    `blocks` tower blocks (DeepStack taps kept where they fit)."""
    from transformers import AutoModel

    from faste_mm.tools.shapes import SHAPES, _save_preprocessing, build_config

    preset = SHAPES["qwen3-vl-embedding-2b"]
    deepstack = [i for i in preset.vision["deepstack"] if i < blocks] or [blocks - 1]
    small = replace(preset, layers=layers, vision={**preset.vision, "depth": blocks, "deepstack": deepstack})
    torch.manual_seed(0)
    AutoModel.from_config(build_config(small), dtype=torch.float32).save_pretrained(path)
    _save_preprocessing(preset, path)
    return path


def _kinds(text: str) -> list[tuple[str, str, int]]:
    kinds = []
    for spec in names(text):
        kind, size, n = spec.rsplit(":", 2) if spec.count(":") == 2 else (*spec.split(":", 1), "1")
        if kind not in ("page", "image", "text") or not n.isdigit() or int(n) < 1:
            raise ConfigError(f"--kinds {spec}: expected KIND:SIZE:N with KIND page, image or text, e.g. image:640x480:2")
        kinds.append((kind, size, int(n)))
    return kinds


def run(args: argparse.Namespace) -> SuiteRun:
    with scratch(args.workdir, "bench-cpu-") as work:
        return _run(args, work)


def _run(args: argparse.Namespace, work: Path) -> SuiteRun:
    from faste_mm import Embedder
    from faste_mm.bench.inputs import make_inputs
    from faste_mm.bench.model import _hf_forward
    from faste_mm.model.backbones.loading import choose_dtype
    from faste_mm.tools.check_cost import measure_check_cost
    from faste_mm.tools.roofline import mean_rate, measure_rates, stage_rates

    settings, kinds = names(args.settings), _kinds(args.kinds)
    if unknown := [s for s in settings if s not in SETTINGS]:
        raise ConfigError(f"--settings {','.join(unknown)}: unknown; choose among {', '.join(SETTINGS)}")
    if "float32" not in settings:
        raise ConfigError("--settings must include float32: every speed-up is read against it")
    cpu = torch.device("cpu")
    not_run = {}
    if "int8" in settings:  # the default contenders on any CPU: int8 only where `--dtype int8` runs
        try:
            choose_dtype("int8", cpu)
        except ConfigError as refused:
            settings.remove("int8")
            not_run["int8"] = str(refused)
    model = args.model or build(work / "model", args.layers, args.blocks)
    # only the dtypes the contenders run in ("hf": transformers in bfloat16)
    rate_dtypes = tuple(dict.fromkeys("bfloat16" if name == "hf" else name.split("-")[0] for name in settings))
    first_rates = measure_rates(cpu, rate_dtypes)
    embedders = {}
    for name in settings:
        if name == "hf":
            continue
        dtype = name.split("-")[0]
        embedder = Embedder.from_pretrained(str(model), device="cpu", dtype=dtype)
        if name == "bfloat16-attn-fp32":
            embedder.backbone.tower.trials.requested = "float32"  # the rule this replaces
        if name.endswith("-mlp-separate"):
            embedder.backbone.mlp.trials.requested = "separate"  # what the fused decoder MLP replaces
        embedders[name] = embedder
    # the official forward at the dtype transformers' default ("auto") loads the real checkpoint in
    hf = Embedder.from_pretrained(str(model), device="cpu", dtype="bfloat16") if "hf" in settings else None
    tokenizer = embedders["float32"].serializer.processor.tokenizer
    rows = []
    for kind, size, n in kinds:
        # a page as the page-sized image faste-mm renders it to (the transformers path takes no PDFs)
        inputs = make_inputs(f"{'image' if kind == 'page' else kind}:{size}", n, work / f"in-{kind}", tokenizer)
        runs = {name: (lambda e=e: e.encode_documents(inputs)) for name, e in embedders.items()}
        if hf is not None:
            runs["hf"] = _hf_forward(hf, inputs, 8)
        # the warm-up round also settles the tower attention trial; each run reports its own model seconds
        before = first_rates if not rows else measure_rates(cpu, rate_dtypes)
        timed = mirrored_rounds(runs, args.repeats)
        # A shared VM's matrix rate drifts by 2-3x between hours (another guest on the core's sibling):
        # each kind is judged by the rate measured just before and just after its own rounds.
        after = measure_rates(cpu, rate_dtypes)
        rates = {k: mean_rate(before[k], after[k]) for k in before}
        times, stages, towers = {}, {}, {}
        for name, t in timed.items():
            stats = [getattr(result, "stats", None) for result in t.outputs]
            times[name] = [result.forward_s if s is None else s.forward_s for result, s in zip(t.outputs, stats)]
            towers[name] = [r.tower_s if s is None else s.tower_s for r, s in zip(t.outputs, stats)]
            stages[name] = [(s.flops_vision, s.tower_s, s.flops_realised, s.decoder_s) for s in stats if s is not None]
        entry = {"kind": kind, "inputs": f"{kind}:{size} x{n}", "forward_s": {k: statistics.median(v) for k, v in times.items()},
                 "rounds_s": times}  # each timed round's seconds: how far the machine moved under them
        # each contender's vision tower seconds (transformers' by hooks on its tower): where the time goes
        entry["tower_s"] = {k: statistics.median(v) for k, v in towers.items() if v and None not in v}
        base = entry["forward_s"]
        entry["speedup_vs_float32"] = {k: base["float32"] / v for k, v in base.items()}
        if "hf" in base:
            entry["speedup_vs_hf"] = {k: base["hf"] / v for k, v in base.items()}
        entry["matmul_rates"] = {k: {"before": before[k].tflops, "after": after[k].tflops} for k in before}
        entry["roofline"] = {}
        for name, measured in stages.items():
            if not measured:
                continue
            fv, ts, fd, ds = (statistics.median(column) for column in zip(*measured))
            dtype = embedders[name].dtype_choice.name
            entry["roofline"][name] = {k: r.to_dict() for k, r in
                                       stage_rates({"tower": (fv, ts), "decoder": (fd, ds)}, dtype, rates).items()}
        entry["kernels"] = {name: e.kernel_choices() for name, e in embedders.items()}
        cost = measure_check_cost(embedders["bfloat16"], inputs) if "bfloat16" in embedders else None
        entry["check_cost_bfloat16"] = cost.to_dict() if cost else None
        entry["load_after"] = os.getloadavg()
        rows.append(entry)
    params = {"model": str(args.model) if args.model else "qwen3-vl-embedding-2b (real width)", "layers": args.layers,
              "tower_blocks": args.blocks, "rounds": args.repeats, "kinds": args.kinds, "settings": settings,
              "torch_threads": torch.get_num_threads(), "not_run": not_run}
    machine = {"matmul_rates": {k: r.to_dict() for k, r in first_rates.items()}}
    table = _table(rows, settings) + "".join(f"\n{name} not run: {why}" for name, why in not_run.items())
    return SuiteRun(rows, params, "cpu", ",".join(settings), machine, table)


def _table(rows: list[dict], settings: list[str]) -> str:
    """Forward seconds per input and contender, with the speed-up over float32."""
    lines = ["forward seconds, median of mirrored rounds (x float32; of which the vision tower)",
             "| input | " + " | ".join(settings) + " |", "|---|" + "---:|" * len(settings)]
    for row in rows:
        towers = row.get("tower_s", {})
        cells = [f"{row['forward_s'][s]:.2f} ({row['speedup_vs_float32'][s]:.2f}x"
                 + (f"; tower {towers[s]:.2f}" if towers.get(s) else "") + ")" for s in settings]
        lines.append(f"| {row['inputs']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)

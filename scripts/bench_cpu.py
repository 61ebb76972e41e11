"""The CPU figures of docs/cpu.md, side by side in ONE process with mirrored rounds: for pages,
photos and texts at the real Qwen3-VL-Embedding-2B width (random weights, fewer layers and tower
blocks than the real 28/24 when --layers/--blocks say so: per-layer rates are what the ratios
compare), faste-mm in float32, in bfloat16 (tower attention dtype by trial), in bfloat16 with the
old float32-attention rule, in int8, and the official transformers forward; plus the GEMM rates,
each stage's fraction of them, and the FastE check's cost.

    python scripts/bench_cpu.py --layers 4 --blocks 4 --rounds 2 --out docs/bench/cpu-amx-2b-width.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
from dataclasses import replace
from pathlib import Path

import torch


def build(path: Path, layers: int, blocks: int) -> Path:
    from transformers import AutoModel

    from faste_mm.tools.shapes import SHAPES, _save_preprocessing, build_config

    preset = SHAPES["qwen3-vl-embedding-2b"]
    deepstack = [i for i in preset.vision["deepstack"] if i < blocks] or [blocks - 1]
    small = replace(preset, layers=layers, vision={**preset.vision, "depth": blocks, "deepstack": deepstack})
    torch.manual_seed(0)
    AutoModel.from_config(build_config(small), dtype=torch.float32).save_pretrained(path)
    _save_preprocessing(preset, path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--kinds", default="page:1240x1754:1,image:640x480:2,text:1000:4")
    parser.add_argument("--settings", default="float32,bfloat16,bfloat16-attn-fp32,int8,hf")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    from faste_mm import Embedder
    from faste_mm.model.backbones.loading import read_cpu_flags
    from faste_mm.tools.bench import _hf_forward
    from faste_mm.tools.bench_inputs import make_inputs
    from faste_mm.tools.check_cost import measure_check_cost
    from faste_mm.tools.roofline import measure_rates, stage_rates

    flags = sorted(f for f in read_cpu_flags() if f.startswith(("amx", "avx512_bf16", "avx512_vnni", "avx_vnni")))
    work = Path(tempfile.mkdtemp(prefix="bench-cpu-"))
    model = build(work / "model", args.layers, args.blocks)
    rates = measure_rates(torch.device("cpu"))
    embedders = {}
    for name in args.settings.split(","):
        if name == "hf":
            continue
        dtype = "bfloat16" if name.startswith("bfloat16") else name
        embedder = Embedder.from_pretrained(str(model), device="cpu", dtype=dtype)
        if name == "bfloat16-attn-fp32":
            embedder.backbone.tower.trials.requested = "float32"  # the rule this replaces
        embedders[name] = embedder
    # the official forward at the dtype transformers' default ("auto") loads the real checkpoint in
    hf = Embedder.from_pretrained(str(model), device="cpu", dtype="bfloat16") if "hf" in args.settings.split(",") else None
    tokenizer = embedders["float32"].serializer.processor.tokenizer
    report = {"cpu_flags": flags, "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
              "torch_threads": torch.get_num_threads(), "torch": torch.__version__, "layers": args.layers,
              "tower_blocks": args.blocks, "width": "qwen3-vl-embedding-2b (real)", "rounds": args.rounds,
              "load_before": os.getloadavg(), "matmul_rates": {k: r.to_dict() for k, r in rates.items()}, "kinds": {}}
    for spec in args.kinds.split(","):
        kind, size, n = spec.rsplit(":", 2) if spec.count(":") == 2 else (*spec.split(":"), "1")
        # a page as the page-sized image faste-mm renders it to (the transformers path takes no PDFs)
        inputs = make_inputs(f"{'image' if kind == 'page' else kind}:{size}", int(n), work / f"in-{kind}", tokenizer)
        runs = {name: (lambda e=e: e.encode_documents(inputs)) for name, e in embedders.items()}
        if hf is not None:
            runs["hf"] = _hf_forward(hf, inputs, 8)
        times = {name: [] for name in runs}
        stages = {name: [] for name in runs}
        for name, run in runs.items():  # warm-up, and the tower attention trial
            run()
        for round_ in range(args.rounds):
            for name in (list(runs) if round_ % 2 == 0 else list(runs)[::-1]):
                result = runs[name]()
                stats = getattr(result, "stats", None)
                times[name].append(result.forward_s if stats is None else stats.forward_s)
                if stats is not None:
                    stages[name].append((stats.flops_vision, stats.tower_s, stats.flops_realised, stats.decoder_s))
        entry = {"inputs": f"{kind}:{size} x{n}", "forward_s": {k: statistics.median(v) for k, v in times.items()}}
        base = entry["forward_s"]
        entry["speedup_vs_float32"] = {k: base["float32"] / v for k, v in base.items()}
        if "hf" in base:
            entry["speedup_vs_hf"] = {k: base["hf"] / v for k, v in base.items()}
        entry["roofline"] = {}
        for name, rows in stages.items():
            if not rows:
                continue
            fv, ts, fd, ds = (statistics.median(column) for column in zip(*rows))
            dtype = embedders[name].dtype_choice.name
            entry["roofline"][name] = {k: r.to_dict() for k, r in
                                       stage_rates({"tower": (fv, ts), "decoder": (fd, ds)}, dtype, rates).items()}
        entry["kernels"] = {name: e.kernel_choices() for name, e in embedders.items()}
        cost = measure_check_cost(embedders["bfloat16"], inputs) if "bfloat16" in embedders else None
        entry["check_cost_bfloat16"] = cost.to_dict() if cost else None
        entry["load_after"] = os.getloadavg()
        report["kinds"][kind] = entry
        print(json.dumps(entry, indent=1), flush=True)
        args.out.write_text(json.dumps(report, indent=1))
    report["load_after"] = os.getloadavg()
    args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

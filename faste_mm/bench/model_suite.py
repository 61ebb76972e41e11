"""The model suite's front (`faste-mm bench`, `faste-mm bench model`): its options, declared as
every suite's are (faste_mm.bench.options), turned into a `BenchConfig`; the model built (--shape)
or loaded (--model); `model.run_bench` on the inputs; its report as the one result schema
(`SuiteRun`) with a table for people, one column per setting and one row per metric.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from pathlib import Path

from faste_mm.bench.options import add_batching, add_device, add_inputs, add_model, add_settings, add_shape, from_env, names
from faste_mm.bench.schema import SuiteRun
from faste_mm.errors import ConfigError

FAST_E_FLAGS = ("--r-max", "--warmup-layer", "--threshold", "--trigger-layer", "--patch-dedup")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The model suite's options; each reads its FASTE_MM_* variable (docs/cli.md lists them)."""
    add_model(parser, env=True)
    add_shape(parser, scale=1.0, shape=None, env=True)
    add_inputs(parser, "text:1000", n=32, env=True)
    add_settings(parser, *FAST_E_FLAGS, sweep=True)
    add_batching(parser, sweep_unpadded=True)
    parser.add_argument("--workers", type=int, default=from_env("--workers"),
                        help="preprocessing threads (default: one per CPU core, at most 8; 0 = in the model's thread, "
                             "no overlap; env FASTE_MM_WORKERS)")
    parser.add_argument("--repeats", type=int, default=from_env("--repeats", 3),
                        help="timed repeats after one warm-up; median and min-max reported (default 3; env FASTE_MM_REPEATS)")
    parser.add_argument("--compare", default=from_env("--compare", ""),
                        help="also measure these, comma-separated: hf, sentence-transformers (default none; env FASTE_MM_COMPARE)")
    add_device(parser)


def run(args: argparse.Namespace, progress=None) -> SuiteRun:
    """Measure (see the module docstring). progress: a CLI progress view (`faste_mm.cli.progress`),
    shown while the model loads and as each setting runs; None: nothing shown."""
    from faste_mm import BatchingConfig, Embedder, FastEConfig
    from faste_mm.bench.inputs import make_inputs
    from faste_mm.bench.model import BenchConfig, run_bench
    from faste_mm.model.patch_dedup import PATCH_DEDUP_MODES, dedup_config
    from faste_mm.retrieval.profile import SWEEP_R_MAX

    if (args.model is None) == (args.shape is None):
        raise ConfigError("give exactly one of --model (a checkpoint to measure) and --shape (a random-weight "
                          "architecture to build)")
    if not 0 < args.scale_hidden <= 1:
        raise ConfigError(f"--scale-hidden must be in (0, 1], got {args.scale_hidden:g}")
    if args.patch_dedup is not None and args.patch_dedup not in PATCH_DEDUP_MODES:
        raise ConfigError(f"--patch-dedup {args.patch_dedup!r}: choose one of {', '.join(PATCH_DEDUP_MODES)}")
    config = BenchConfig(  # checked here, before a model is built or loaded (minutes with real weights)
        r_max=args.r_max or SWEEP_R_MAX,
        fast_e=FastEConfig(r_max=0.0, warmup_layer=args.warmup_layer, threshold=args.threshold,
                           trigger_layer=args.trigger_layer),
        repeats=args.repeats, compare=tuple(names(args.compare)), unpadded=tuple(names(args.unpadded)),
        patch_dedup=None if args.patch_dedup is None else dedup_config(args.patch_dedup))
    batching = BatchingConfig(batch_tokens=args.batch_tokens, workers=args.workers)
    with tempfile.TemporaryDirectory(prefix="faste-mm-bench-") as workdir:
        model = str(args.model) if args.model is not None else _build(args, Path(workdir) / "model")
        with progress.loading(model) if progress is not None else contextlib.nullcontext():
            embedder = Embedder.from_pretrained(model, device=args.device, dtype=args.dtype, batching=batching)
        tokenizer = getattr(embedder.serializer, "tokenizer", None) or embedder.serializer.processor.tokenizer
        items = make_inputs(args.inputs, args.n, Path(workdir) / "inputs", tokenizer)
        label = f"{args.inputs} x{args.n}" + (f" ({args.shape}, scale {args.scale_hidden:g})" if args.shape else "")
        report = run_bench(embedder, items, config, label, progress=progress)
    params = {"model": report.model, "shape": args.shape, "scale_hidden": args.scale_hidden if args.shape else None,
              "inputs": report.inputs, "n": args.n, "repeats": args.repeats, "memory_kind": report.memory_kind,
              "batching": report.batching, "dtype_reason": report.dtype.get("reason"),
              "matmul_rates": report.matmul_rates, "check_cost": report.check_cost, "kernels": report.kernels}
    return SuiteRun([s.to_dict() for s in report.settings], params, report.device, report.dtype.get("dtype"),
                    text=_text(report))


def _build(args: argparse.Namespace, folder: Path) -> str:
    """--shape at --scale-hidden, saved in the dtype it will run in (an 8B model in float32 is
    32 GB to write and read; int8 is quantized on load, from float32)."""
    import logging

    import torch

    from faste_mm.model.backbones.loading import resolve_dtype
    from faste_mm.tools.shapes import build_shape_model

    logging.getLogger(__name__).info("building random-weight %s (scale %g)", args.shape, args.scale_hidden)
    dtype = resolve_dtype(args.dtype, torch.device(args.device))
    return str(build_shape_model(args.shape, folder, args.scale_hidden, torch.float32 if dtype == torch.int8 else dtype))


def _text(report) -> str:
    """One column per setting, one row per metric (fits a terminal with many settings); then the
    roofline, the FastE check's cost, the kernels chosen and where the unpadded trial ran."""
    rows = {
        "items/s": lambda s: f"{s.items_per_s:.2f}",
        "tokens/s": lambda s: f"{s.tokens_per_s:.0f}",
        "forward s (min-max)": lambda s: f"{s.forward_s.median:.3f} ({s.forward_s.min:.3f}-{s.forward_s.max:.3f})",
        "e2e s (min-max)": lambda s: f"{s.e2e_s.median:.3f} ({s.e2e_s.min:.3f}-{s.e2e_s.max:.3f})",
        f"peak memory ({report.memory_kind})": lambda s: f"{s.peak_memory_bytes / 2**20:.0f} MiB",
        "prefix removal": lambda s: f"{s.prefix_removal:.1%}",
        "FLOPs reduction": lambda s: f"{s.flops_reduction:.1%}",
        "mean trigger layer": lambda s: "-" if s.mean_trigger_layer is None else f"{s.mean_trigger_layer:.1f}",
        "FLOPs-implied speedup": lambda s: f"{s.flops_implied_speedup:.3f}x",
        "forward speedup": lambda s: f"{s.forward_speedup:.3f}x",
        "e2e speedup": lambda s: f"{s.e2e_speedup:.3f}x",
        "realisation (fwd/implied)": lambda s: f"{s.realisation:.3f}",
        "e2e / forward speedup": lambda s: f"{s.e2e_over_forward:.3f}",
        "max abs(v - v_full)": lambda s: f"{s.max_abs_diff_vs_full:.1e}",
        "attention after compression": lambda s: ", ".join(f"{k} x{v}" for k, v in s.attention.items()) or "-",
    }
    settings = report.settings
    if any(s.vision_flops_share for s in settings):  # images/pages: the whole forward too
        rows["vision tower share of full FLOPs"] = lambda s: f"{s.vision_flops_share:.1%}" if s.r_max is not None else "-"
        rows["FLOPs-implied, with vision"] = lambda s: f"{s.flops_implied_speedup_with_vision:.3f}x"
        rows["realisation, with vision"] = lambda s: f"{s.realisation_with_vision:.3f}"
        rows["tower s / decoder s"] = lambda s: f"{s.tower_s:.3f} / {s.decoder_s:.3f}" if s.r_max is not None else "-"
        rows["tower share of time"] = lambda s: f"{s.tower_time_share:.1%}" if s.r_max is not None else "-"
        rows["tower share of FLOPs"] = lambda s: f"{s.tower_flops_share:.1%}" if s.r_max is not None else "-"
    if any(s.checks for s in settings):  # FastE by alignment: what its checks cost the decoder
        rows["alignment checks / run"] = lambda s: str(s.checks) if s.checks else "-"
        rows["decoder s - full, per check"] = lambda s: (
            "-" if s.decoder_s_per_check is None else f"{s.decoder_s_per_check * 1e3:+.3f} ms")
    dtype = f"{report.dtype['dtype']} ({report.dtype['reason']})" if report.dtype else "?"
    lines = [f"faste-mm bench: {report.inputs} on {report.device}, {dtype}", "",
             "| metric | " + " | ".join(s.name for s in settings) + " |",
             "|---|" + "---:|" * len(settings)]
    lines += [f"| {name} | " + " | ".join(cell(s) for s in settings) + " |" for name, cell in rows.items()]
    lines += ["", *_roofline(report)]
    trial = next((s for s in settings if s.attention_trial), None)  # "auto" settles once per layout
    if trial is not None:
        shown = ", ".join(f"{k} {v:.4f} s" if isinstance(v, float) else f"{k} {v}" for k, v in trial.attention_trial.items())
        lines.append(f"unpadded auto trial ({trial.name}): {shown}")
    return "\n".join(lines)


def _roofline(report) -> list[str]:
    """The machine's GEMM rates, each stage's share of them, the FastE check's cost, the kernels."""
    lines = []
    if report.matmul_rates:
        lines.append("GEMM rate: " + ", ".join(f"{d} {r['tflops']:.3f} TFLOP/s" for d, r in report.matmul_rates.items()))
    for s in report.settings:
        for stage, rate in s.roofline.items():
            lines.append(f"{s.name} {stage}: {rate['flops'] / 1e12:.2f} TFLOP in {rate['seconds']:.2f} s = "
                         f"{rate['tflops']:.3f} TFLOP/s, {rate['fraction']:.0%} of the measured GEMM rate")
    if report.check_cost:
        c = report.check_cost
        lines.append(f"FastE check (not firing): {c['check_s'] * 1e3:.2f} ms per monitored layer = {c['share']:.2%} of "
                     f"layer {c['layer']} ({c['layer_s'] * 1e3:.1f} ms, {c['tokens']} tokens)")
        if c.get("decoder_s"):  # the whole decoder checked before every layer, each way of reading
            d = c["decoder_s"]
            lines.append(f"FastE check, whole decoder: full {d['full']:.4f} s; " + "; ".join(
                f"checked, {name} {d[name]:.4f} s = {c['per_layer_s'][name] * 1e3:+.3f} ms per layer"
                for name in c["per_layer_s"]))
    return lines + list(report.kernels)

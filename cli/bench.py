"""`faste-mm bench [SUITE]`: the one benchmark entry point (faste_mm.bench). With no suite (or
`model`): FastE against the full forward (and optionally HF / sentence-transformers) on the same
inputs; prints a table (or --format json) and writes JSON with --out. Every other suite is a
subcommand whose arguments go to its own parser (`faste_mm.bench.entry`); all write one schema."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from faste_mm.bench.options import INPUTS_WORDS, OUT_HELP  # plain words: no torch at start-up
from faste_mm.cli.common import fail, print_json, setup_logging, stderr, stdout
from faste_mm.cli.options import (DEFAULT_BATCH_TOKENS, BatchTokens, Debug, Device, Dtype, Format, Model, OutputFormat,
                                  PatchDedup, RMax, Threshold, TriggerLayer, Unpadded, WarmupLayer, fast_e_config,
                                  patch_dedup_config, ratios)
from faste_mm.cli.progress import Progress
from faste_mm.errors import ConfigError, FasteError


def bench_command(
    ctx: typer.Context,
    model: Model = None,
    shape: Optional[str] = typer.Option(None, envvar="FASTE_MM_SHAPE", help="Random-weight real architecture: qwen3-vl-embedding-2b | qwen3-vl-embedding-8b | qwen3-embedding-0.6b | qwen3-embedding-4b."),
    scale_hidden: float = typer.Option(1.0, envvar="FASTE_MM_SCALE_HIDDEN", help="Shrink widths of --shape by this factor (layers and heads kept), e.g. 0.25 on a CPU."),
    inputs: str = typer.Option("text:1000", envvar="FASTE_MM_INPUTS", help=f"{INPUTS_WORDS}."),
    n: int = typer.Option(32, envvar="FASTE_MM_N", help="Number of inputs."),
    r_max: RMax = None,
    warmup_layer: WarmupLayer = None,
    threshold: Threshold = None,
    trigger_layer: TriggerLayer = None,
    patch_dedup: PatchDedup = None,
    batch_tokens: BatchTokens = DEFAULT_BATCH_TOKENS,
    workers: Optional[int] = typer.Option(None, envvar="FASTE_MM_WORKERS", help="Preprocessing threads (default: one per CPU core, at most 8; 0 = in the model's thread, no overlap)."),
    unpadded: Unpadded = "auto",
    repeats: int = typer.Option(3, envvar="FASTE_MM_REPEATS", help="Timed repeats after one warm-up; median and min-max reported."),
    compare: str = typer.Option("", envvar="FASTE_MM_COMPARE", help="Comma-separated: hf, sentence-transformers."),
    device: Device = "auto",
    dtype: Dtype = "auto",
    output: OutputFormat = Format.table,
    out: Optional[Path] = typer.Option(None, "--out", "-o", envvar="FASTE_MM_BENCH_OUT", help=f"{OUT_HELP[0].upper()}{OUT_HELP[1:]}."),
    debug: Debug = False,
) -> None:
    """Measure speed, memory and FLOPs of FastE settings against the full forward (the model suite);
    `faste-mm bench SUITE --help` for the other suites."""
    if ctx.invoked_subcommand is not None:  # `faste-mm bench SUITE ...`: the suite runs, not this
        return
    from faste_mm import BatchingConfig, Embedder
    from faste_mm.bench.schema import SuiteRun, describe, finish, start
    from faste_mm.bench.model import BenchConfig, run_bench
    from faste_mm.bench.inputs import make_inputs
    from faste_mm.model.backbones.loading import resolve_device, resolve_dtype
    from faste_mm.tools.shapes import build_shape_model
    import torch

    setup_logging(debug)
    if (model is None) == (shape is None):
        raise typer.BadParameter("give exactly one of --model and --shape")
    try:
        if out is not None and not out.parent.is_dir():
            raise ConfigError(f"--out {out}: folder {out.parent} does not exist; create it first")
        config = BenchConfig(
            r_max=ratios(r_max),
            fast_e=fast_e_config(0.0, warmup_layer, threshold, trigger_layer),
            repeats=repeats,
            compare=tuple(c.strip() for c in compare.split(",") if c.strip()),
            unpadded=tuple(u.strip() for u in unpadded.split(",") if u.strip()),
            patch_dedup=patch_dedup_config(patch_dedup),
        )
        _check_before_loading(n, scale_hidden, config, trigger_layer, threshold)
        begun = start()
        batching = BatchingConfig(batch_tokens=batch_tokens, workers=workers)
        with tempfile.TemporaryDirectory(prefix="faste-mm-bench-") as workdir:
            if shape is not None:
                stderr.print(f"building random-weight {shape} (scale {scale_hidden:g})")
                # saved in the dtype it will run in: an 8B model in float32 is 32 GB to write and read
                weights_dtype = resolve_dtype(dtype, resolve_device(device))
                weights_dtype = torch.float32 if weights_dtype == torch.int8 else weights_dtype  # quantized on load
                model = str(build_shape_model(shape, Path(workdir) / "model", scale_hidden, weights_dtype))
            with Progress() as progress:
                with progress.loading(model):
                    embedder = Embedder.from_pretrained(model, device=device, dtype=dtype,
                                                        batching=batching)
                tokenizer = getattr(embedder.serializer, "tokenizer", None) or embedder.serializer.processor.tokenizer
                items = make_inputs(inputs, n, Path(workdir) / "inputs", tokenizer)
                label = f"{inputs} x{n}" + (f" ({shape}, scale {scale_hidden:g})" if shape else "")
                report = run_bench(embedder, items, config, label, progress=progress)
    except FasteError as error:
        fail(error, debug)
    params = {"model": report.model, "shape": shape, "scale_hidden": scale_hidden if shape else None,
              "inputs": report.inputs, "n": n, "repeats": repeats, "memory_kind": report.memory_kind,
              "batching": report.batching, "dtype_reason": report.dtype.get("reason"),
              "matmul_rates": report.matmul_rates, "check_cost": report.check_cost, "kernels": report.kernels}
    result = finish("model", begun, SuiteRun([s.to_dict() for s in report.settings], params, report.device,
                                             report.dtype.get("dtype")))
    payload = result.to_dict()
    if out is not None:
        try:
            out.write_text(json.dumps(payload, indent=2))
        except OSError as error:
            fail(ConfigError(f"--out {out}: cannot write the report ({error}); choose another path"), debug)
        stderr.print(f"wrote {out}", highlight=False)
    if output is Format.json:
        print_json(payload)
    else:
        _render(report)
    stderr.print(describe(result), highlight=False, markup=False)


def _suite_command(suite: str):
    """A subcommand that hands its arguments, unparsed, to the suite's own parser."""
    def command(ctx: typer.Context) -> None:
        from faste_mm.bench.entry import run_suite

        run_suite(suite, list(ctx.args), prog=f"faste-mm bench {suite}")
    return command


def bench_app() -> typer.Typer:
    """`faste-mm bench`: the model suite as the group's own options, each suite a subcommand
    (`model` too: `faste-mm bench model ...` equals `faste-mm bench ...`)."""
    from faste_mm.bench import SUITES

    group = typer.Typer(add_completion=False)
    group.callback(invoke_without_command=True)(bench_command)
    group.command("model", help=SUITES["model"][1] + ".")(bench_command)
    passthrough = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}
    for suite, (_, summary) in SUITES.items():
        if suite != "model":
            group.command(suite, help=summary + " (--help: its options).", context_settings=passthrough,
                          add_help_option=False)(_suite_command(suite))
    return group


def _check_before_loading(n: int, scale_hidden: float, config, trigger_layer, threshold) -> None:
    """Refuse out-of-range numbers before a model is built or loaded (minutes with real weights)."""
    from faste_mm import FastEConfig

    if n < 1:
        raise ConfigError(f"--n must be >= 1 (inputs), got {n}")
    if not 0 < scale_hidden <= 1:
        raise ConfigError(f"--scale-hidden must be in (0, 1], got {scale_hidden:g}")
    for r_max in config.r_max:  # FastEConfig checks each setting's fields as the run would
        FastEConfig(r_max=r_max, trigger_layer=trigger_layer, threshold=threshold)


def _render(report) -> None:
    """One column per setting, one row per metric: fits a terminal with many settings."""
    dtype = f"{report.dtype['dtype']} ({report.dtype['reason']})" if report.dtype else "?"
    table = Table(title=f"faste-mm bench: {report.inputs}\non {report.device}, {dtype}")
    table.add_column("metric")
    for s in report.settings:
        table.add_column(s.name, justify="right")
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
        "max |v - v_full|": lambda s: f"{s.max_abs_diff_vs_full:.1e}",
        "attention after compression": lambda s: ", ".join(f"{k} x{v}" for k, v in s.attention.items()) or "-",
    }
    if any(s.vision_flops_share for s in report.settings):  # images/pages: the whole forward too
        rows["vision tower share of full FLOPs"] = lambda s: f"{s.vision_flops_share:.1%}" if s.r_max is not None else "-"
        rows["FLOPs-implied, with vision"] = lambda s: f"{s.flops_implied_speedup_with_vision:.3f}x"
        rows["realisation, with vision"] = lambda s: f"{s.realisation_with_vision:.3f}"
        rows["tower s / decoder s"] = lambda s: f"{s.tower_s:.3f} / {s.decoder_s:.3f}" if s.r_max is not None else "-"
        rows["tower share of time"] = lambda s: f"{s.tower_time_share:.1%}" if s.r_max is not None else "-"
        rows["tower share of FLOPs"] = lambda s: f"{s.tower_flops_share:.1%}" if s.r_max is not None else "-"
    if any(s.checks for s in report.settings):  # FastE by alignment: what its checks cost the decoder
        rows["alignment checks / run"] = lambda s: str(s.checks) if s.checks else "-"
        rows["decoder s - full, per check"] = lambda s: (
            "-" if s.decoder_s_per_check is None else f"{s.decoder_s_per_check * 1e3:+.3f} ms")
    for name, cell in rows.items():
        table.add_row(name, *(cell(s) for s in report.settings))
    stdout.print(table)
    _render_roofline(report)
    for setting in report.settings:
        if setting.attention_trial:  # the "auto" trial settles once per layout; show where it ran
            trial = ", ".join(f"{k} {v:.4f} s" if isinstance(v, float) else f"{k} {v}" for k, v in setting.attention_trial.items())
            stdout.print(f"unpadded auto trial ({setting.name}): {trial}")
            break


def _render_roofline(report) -> None:
    """The machine's GEMM rates, each stage's share of them, the FastE check's cost, the kernels."""
    if report.matmul_rates:
        stdout.print("GEMM rate: " + ", ".join(f"{d} {r['tflops']:.3f} TFLOP/s" for d, r in report.matmul_rates.items()))
    for s in report.settings:
        for stage, rate in s.roofline.items():
            stdout.print(f"{s.name} {stage}: {rate['flops'] / 1e12:.2f} TFLOP in {rate['seconds']:.2f} s = "
                         f"{rate['tflops']:.3f} TFLOP/s, {rate['fraction']:.0%} of the measured GEMM rate")
    if report.check_cost:
        c = report.check_cost
        stdout.print(f"FastE check (not firing): {c['check_s'] * 1e3:.2f} ms per monitored layer = {c['share']:.2%} of "
                     f"layer {c['layer']} ({c['layer_s'] * 1e3:.1f} ms, {c['tokens']} tokens)")
        if c.get("decoder_s"):  # the whole decoder checked before every layer, each way of reading
            d = c["decoder_s"]
            stdout.print(f"FastE check, whole decoder: full {d['full']:.4f} s; " + "; ".join(
                f"checked, {name} {d[name]:.4f} s = {c['per_layer_s'][name] * 1e3:+.3f} ms per layer"
                for name in c["per_layer_s"]))
    for text in report.kernels:
        stdout.print(text)

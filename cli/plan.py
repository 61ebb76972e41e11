"""`faste-mm plan`: measure on a sample of your own files what each faster setting (image pixel
cap, FastE r_max, dtype) costs in search results and saves in time; recommend the cheapest that
keeps results; write plan.json for `faste-mm index --plan`."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Optional

import typer
from rich import box
from rich.table import Table

from faste_mm.cli.common import fail, markup_safe, print_json, setup_logging, stderr, stdout
from faste_mm.cli.options import (DEFAULT_BATCH_TOKENS, DEFAULT_MODEL, BatchTokens, Debug, Device, Format, Model,
                                  OutputFormat, RMax, Threshold, TriggerLayer, WarmupLayer, fast_e_config, ratios)
from faste_mm.cli.progress import Progress, format_span
from faste_mm.errors import ConfigError, FasteError
from faste_mm.model.official import PIXEL_SWEEP  # plain data: no torch at start-up

_PIXELS = ",".join(map(str, PIXEL_SWEEP))
_SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def plan_command(
    paths: list[Path] = typer.Argument(..., help="Your files and folders (images, PDFs, .txt/.md, videos): the sample is drawn from them."),
    model: Model = None,
    sample: int = typer.Option(200, "--sample", envvar="FASTE_MM_PLAN_SAMPLE", help="Items sampled (seeded, stratified by kind: photos, pages, texts, videos); default 200."),
    seed: int = typer.Option(0, "--seed", envvar="FASTE_MM_PLAN_SEED", min=0, help="Seed of the sample (default 0: the same files every run)."),
    queries: Optional[Path] = typer.Option(None, "--queries", envvar="FASTE_MM_QUERIES", help="Text file of typical queries, one per line: adds their top-10 agreement."),
    target: float = typer.Option(0.95, "--target", envvar="FASTE_MM_PLAN_TARGET", help="Neighbour agreement@10 the recommendation must keep, in (0, 1]; default 0.95."),
    p5_floor: Optional[float] = typer.Option(None, "--p5-floor", envvar="FASTE_MM_PLAN_P5_FLOOR", help="5th-percentile cosine to the reference it must also keep (default 1 - 3 x (1 - target))."),
    max_pixels: Optional[str] = typer.Option(None, "--max-pixels", envvar="FASTE_MM_PLAN_MAX_PIXELS", help=f"Comma-separated image/page pixel caps to try (default {_PIXELS})."),
    visual_tokens: Optional[str] = typer.Option(None, "--visual-tokens", envvar="FASTE_MM_PLAN_VISUAL_TOKENS", help="The caps as merged visual tokens instead (N tokens = N x 32 x 32 px), e.g. 1800,980,490,245."),
    r_max: RMax = None,
    dtype: str = typer.Option("auto,float32", "--dtype", envvar="FASTE_MM_PLAN_DTYPE", help="Comma-separated weight dtypes to try: auto | float32 | bfloat16 | float16; default auto,float32."),
    threshold: Threshold = None,
    warmup_layer: WarmupLayer = None,
    trigger_layer: TriggerLayer = None,
    out: Optional[Path] = typer.Option(None, "--out", "-o", envvar="FASTE_MM_PLAN_OUT", help="Write the plan as JSON (for faste-mm index --plan)."),
    plot: Optional[Path] = typer.Option(None, "--plot", envvar="FASTE_MM_PLAN_PLOT", help="Write a PNG of cost vs agreement (needs matplotlib)."),
    batch_tokens: BatchTokens = DEFAULT_BATCH_TOKENS,
    device: Device = "auto",
    output: OutputFormat = Format.table,
    debug: Debug = False,
) -> None:
    """Find the cheapest setting that keeps your search results: every candidate is measured
    against the full forward at the official pixel cap in float32, on a sample of your files."""
    from faste_mm import BatchingConfig, Embedder
    from faste_mm.tools.plan import PlanConfig, plan, sample_files
    from faste_mm.tools.plan_report import plot_plan

    setup_logging(debug, logging.INFO)
    try:
        config = PlanConfig(max_pixels=_pixel_caps(max_pixels, visual_tokens), r_max=ratios(r_max),
                            dtypes=tuple(d.strip() for d in dtype.split(",") if d.strip()) or ("",), target=target,
                            p5_floor=p5_floor, fast_e=fast_e_config(0.0, warmup_layer, threshold, trigger_layer))
        if sample < 2:
            raise ConfigError(f"--sample must be >= 2 (neighbours are compared within the sample), got {sample}")
        texts = _queries(queries)
        for path in (out, plot):
            if path is not None and not path.parent.is_dir():
                raise ConfigError(f"{path}: folder {path.parent} does not exist; create it first")
        drawn = sample_files(paths, sample, seed)  # a typo in a path fails before the model loads
        for reason in drawn.skipped:
            stderr.print(f"[yellow]skipped[/yellow] {markup_safe(reason)}", highlight=False)
        model = model or DEFAULT_MODEL
        with Progress() as progress:
            with progress.loading(model):
                embedder = Embedder.from_pretrained(model, device=device, dtype="float32",
                                                    batching=BatchingConfig(batch_tokens=batch_tokens))
            config = _with_saved_theta(config, embedder)
            kinds = ", ".join(f"{n} {kind}s" for kind, n in _count(drawn.kinds).items())
            progress.status(f"sample: {kinds} (seed {seed}, from {sum(drawn.found.values())} files)")
            report = plan(embedder, drawn.items, config, queries=texts, progress=progress, folder=drawn.folder)
        payload = report.to_dict()
        if out is not None:
            _write(out, lambda: out.write_text(json.dumps(payload, indent=2)))
        if plot is not None:
            _write(plot, lambda: plot_plan(report, plot))
    except FasteError as error:
        fail(error, debug)
    for dtype, why in report.left_out.items():
        stderr.print(f"[yellow]left out[/yellow] --dtype {dtype}: {markup_safe(why)}", highlight=False)
    if output is Format.json:
        print_json(payload)
    else:
        _render(report)
    for path in (out, plot):
        if path is not None:
            stderr.print(f"wrote {markup_safe(path)}", highlight=False)
    if out is not None:
        stderr.print(f"apply it: faste-mm index PATHS --plan {markup_safe(out)} (or --plan {markup_safe(out)}:ROW)",
                     highlight=False)


def _pixel_caps(max_pixels: Optional[str], visual_tokens: Optional[str]) -> tuple[int, ...]:
    """--max-pixels or --visual-tokens as pixel caps (ConfigError naming the flag)."""
    from faste_mm.model.serialization import PIXELS_PER_VISUAL_TOKEN

    if max_pixels is not None and visual_tokens is not None:
        raise ConfigError(f"give --max-pixels or --visual-tokens, not both (--visual-tokens N means --max-pixels "
                          f"N x {PIXELS_PER_VISUAL_TOKEN})")
    flag, text, unit = (("--visual-tokens", visual_tokens, PIXELS_PER_VISUAL_TOKEN) if visual_tokens is not None
                        else ("--max-pixels", max_pixels or _PIXELS, 1))
    try:
        values = tuple(int(part.replace("_", "")) * unit for part in text.split(",") if part.strip())
    except ValueError:
        raise ConfigError(f"{flag} takes comma-separated whole numbers, e.g. {_PIXELS if unit == 1 else '1800,980'}; "
                          f"got {text!r}") from None
    if not values or min(values) < 4096:
        raise ConfigError(f"{flag} {text}: each cap must be at least 4096 pixels (4 visual tokens)")
    return values


def _queries(path: Optional[Path]) -> list[str]:
    if path is None:
        return []
    try:
        lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"--queries {path}: cannot read it ({error}); give a UTF-8 text file, one query per line") from None
    texts = [line for line in lines if line]
    if not texts:
        raise ConfigError(f"--queries {path}: no queries in it; write one query per line")
    return texts


def _with_saved_theta(config, embedder):
    """--threshold, else this model's saved calibration (as index uses it), else the backbone's."""
    from dataclasses import replace

    from faste_mm.retrieval.calibrations import load_calibration

    if config.fast_e.threshold is not None:
        return replace(config, threshold_source="given (--threshold)")
    if config.fast_e.trigger_layer is not None:  # a fixed layer: no theta decides when to compress
        return config
    calibration = load_calibration(embedder.model_id, embedder.loaded.revision)
    if calibration is None or calibration.threshold is None:
        return config
    return replace(config, fast_e=replace(config.fast_e, threshold=calibration.threshold),
                   threshold_source=calibration.describe())


def _count(kinds) -> dict[str, int]:
    counts: dict[str, int] = {}
    for kind in kinds:
        counts[kind] = counts.get(kind, 0) + 1
    return counts


def _write(path: Path, write) -> None:
    try:
        write()
    except OSError as error:
        raise ConfigError(f"{path}: cannot write it ({error}); choose another path") from None


def _render(report) -> None:
    """One row per candidate, cheapest first; the stage split only where the embedder timed it."""
    table = Table(box=None, pad_edge=False, padding=(0, 1), header_style="bold", title=f"faste-mm plan: {report.model_id} on {report.sample_size} of your items "
                        f"({', '.join(f'{n} {k}s' for k, n in report.sample_kinds.items() if n)})\non {report.device}")
    staged = any(row.tower_s_per_item is not None for row in report.candidates)
    timed = all(row.folder_s is not None for row in report.candidates)
    columns = ["row", "pixels", "r_max", "dtype", f"agree@{report.k}", "queries", "cos mean/p5", "s/item",
               *(["tower/dec s"] if staged else []), *(["all files"] if timed else []), "speed-up", "GFLOPs", "marks"]
    for column in columns:
        table.add_column(column, justify="right", no_wrap=column in ("pixels", "cos mean/p5"))
    for i, row in enumerate(report.candidates):
        stages = [f"{row.tower_s_per_item or 0:.3f}/{row.decoder_s_per_item or 0:.3f}"] if staged else []
        table.add_row(f"{i}{'*' if i == report.recommended else ''}{'r' if row.is_reference else ''}",
                      f"{row.max_pixels:,}", "full" if row.r_max == 0 else f"{row.r_max:g}", _SHORT.get(row.dtype, row.dtype),
                      f"{row.agreement:.0%}", "-" if row.query_agreement is None else f"{row.query_agreement:.0%}",
                      f"{row.mean_cos:.3f}/{row.p5_cos:.3f}", f"{row.seconds_per_item:.3f}", *stages,
                      *([format_span(row.folder_s)] if timed else []),
                      f"{row.speedup:.1f}x", f"{row.flops_per_item / 1e9:.1f}",
                      " ".join(mark for mark, on in (("front", row.pareto), ("ok", row.meets_target)) if on))
    # a pipe gets 80 columns: the table fits them (rows as "0*", dtypes short, no outer border)
    stdout.print(table)
    chosen = report.recommendation
    stdout.print(f"recommended (row {report.recommended}, *): {chosen.name} — {chosen.agreement:.0%} of neighbours "
                 f"kept, {chosen.speedup:.2f}x faster than the reference on this device")
    if timed:
        work = ", ".join(f"{n:,} {kind}s" for kind, n in report.folder_items.items() if n)
        stdout.print(f"all files: indexing all {work} found, at each row's seconds per item of each kind "
                     f"measured here; the recommendation about {format_span(chosen.folder_s)}, the reference "
                     f"{format_span(report.reference.folder_s)}")
    stdout.print(f"rule: {report.rule}. r: the reference (full forward, official pixels, float32); front: on "
                 f"the Pareto frontier; ok: meets the rule")
    for base in dict.fromkeys(row.fidelity_base for row in report.candidates if row.fidelity_base):
        dtypes = ", ".join(dict.fromkeys(row.dtype for row in report.candidates if row.fidelity_base == base))
        stdout.print(f"{dtypes} rows: agreement and cosines against {base}, not the reference")
    if report.dtype_prepare_s:
        cast = ", ".join(f"{name} {s:.1f} s" for name, s in report.dtype_prepare_s.items())
        stdout.print(f"weights cast once per dtype (not in the rows): {cast}")

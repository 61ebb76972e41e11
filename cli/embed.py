"""`faste-mm embed`: embed texts, images and PDF pages; print stats or write the vectors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from faste_mm.cli.common import fail, setup_logging, stderr, stdout
from faste_mm.cli.options import (DEFAULT_BATCH_TOKENS, DEFAULT_MODEL, DOCUMENT_R_MAX, BatchTokens, Debug, Device, Dtype,
                                  Format, Model, OutputFormat, PatchDedup, RMax, Threshold, TriggerLayer, Unpadded,
                                  WarmupLayer, fast_e_config, one_ratio, patch_dedup_config)
from faste_mm.cli.progress import Progress
from faste_mm.errors import ConfigError, FasteError


def embed(
    paths: list[Path] = typer.Argument(None, help="Image, PDF and .txt/.md files or folders (walked recursively)."),
    text: list[str] = typer.Option([], "--text", "-t", help="A text to embed; repeatable."),
    model: Model = None,
    r_max: RMax = None,
    warmup_layer: WarmupLayer = None,
    threshold: Threshold = None,
    trigger_layer: TriggerLayer = None,
    patch_dedup: PatchDedup = None,
    instruction: Optional[str] = typer.Option(None, envvar="FASTE_MM_INSTRUCTION", show_default=False,
                                              help="Task instruction: embed as queries (full forward unless --r-max "
                                                   "is given). Default: none, the document format."),
    dim: Optional[int] = typer.Option(None, envvar="FASTE_MM_DIM", min=1, show_default=False,
                                      help="Matryoshka: keep the first DIM dimensions, re-normalised. Default: all."),
    batch_tokens: BatchTokens = DEFAULT_BATCH_TOKENS,
    unpadded: Unpadded = "auto",
    device: Device = "auto",
    dtype: Dtype = "auto",
    out: Optional[Path] = typer.Option(None, "--out", "-o", envvar="FASTE_MM_OUT", help="Write the embeddings (float32, one row per item) to this .npy file."),
    output: OutputFormat = Format.table,
    debug: Debug = False,
) -> None:
    """Embed texts, images and PDF pages; print stats (removal, FLOPs, trigger layer, timings)."""
    from faste_mm import BatchingConfig, Embedder
    from faste_mm.retrieval.scanning import document_items

    setup_logging(debug)
    model = model or DEFAULT_MODEL
    try:
        ratio = one_ratio(r_max)
        if ratio is None:  # documents get the documented default; queries (an instruction) the full forward
            ratio = 0.0 if instruction is not None else DOCUMENT_R_MAX
        fast_e = fast_e_config(ratio, warmup_layer, threshold, trigger_layer)
        if ratio == 0 and trigger_layer is None:
            fast_e = None
        dedup = patch_dedup_config(patch_dedup)
        files, unreadable = document_items(paths) if paths else ([], [])
        for reason in unreadable:
            stderr.print(f"[yellow]skipped[/yellow] {reason}")
        inputs = [*text, *files]
        if not inputs:
            raise typer.BadParameter("give at least one PATH or --text")
        if out is not None:
            out = out.with_suffix(".npy")  # what np.save writes anyway; the summary names the real file
            if not out.parent.is_dir():  # checked before the model runs, so no run is lost to a typo
                raise ConfigError(f"--out {out}: folder {out.parent} does not exist; create it or choose another path")
        with Progress().loading(model):
            embedder = Embedder.from_pretrained(model, device=device, dtype=dtype,
                                                batching=BatchingConfig(batch_tokens=batch_tokens, unpadded=unpadded))
        result = embedder.encode(inputs, fast_e=fast_e, instruction=instruction, dim=dim, on_error="skip",
                                 patch_dedup=dedup)
        if out is not None and result.ok.any():
            import numpy as np

            try:
                np.save(out, result.embeddings)
            except OSError as error:
                raise ConfigError(f"--out {out}: cannot write the embeddings ({error}); choose another path") from None
    except FasteError as error:
        fail(error, debug)
    shares = result.stats.patch_shares()  # items whose image duplicate-patch removal looked at
    summary = {
        "model": embedder.model_id,
        "items": [
            {"index": i, "item": item.describe(), "page": item.page, "ok": bool(ok), "patches_kept": shares.get(i)}
            for i, (item, ok) in enumerate(zip(result.items, result.ok))
        ],
        "failures": [failure.to_dict() for failure in result.failures],
        "stats": result.stats.to_dict(),
        "embeddings_file": None if out is None or not result.ok.any() else str(out),
        "dim": int(result.embeddings.shape[1]),
    }
    if output is Format.json:
        stdout.print_json(json.dumps(summary))
    else:
        _render_summary(summary)
    for failure in result.failures:
        stderr.print(f"[yellow]skipped[/yellow] {failure.reason}")
    if not result.ok.any():
        stderr.print("[red]error:[/red] nothing could be embedded")
        raise typer.Exit(1)


def _render_summary(summary: dict) -> None:
    stats = summary["stats"]
    table = Table(title=f"faste-mm embed ({summary['model']})")
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("items embedded", f"{stats['n_items'] - stats['n_failed']} / {stats['n_items']}"),
        ("dimensions", str(summary["dim"])),
        ("prefix tokens removed", f"{stats['prefix_removal']:.1%}"),
        ("decoder FLOPs reduction", f"{stats['flops_reduction']:.1%}"),
        ("mean trigger layer", "-" if stats["mean_trigger_layer"] is None else f"{stats['mean_trigger_layer']:.1f}"),
        *((("patches kept (--patch-dedup)", f"{stats['patches_kept']:.0%}"),)
          if stats["patches_kept"] is not None else ()),
        ("dtype", f"{stats['dtype']['dtype']} ({stats['dtype']['reason']})"),
        *(("kernel", text) for text in stats.get("kernels", [])),
        ("model forward (s)", f"{stats['forward_s']:.2f}"),
        ("of which vision tower (s)", f"{stats['tower_s']:.2f}"),
        ("end to end (s)", f"{stats['elapsed_s']:.2f}"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    stdout.print(table)

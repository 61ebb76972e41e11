"""`faste-mm embed`: embed texts, images and PDF pages; print stats or write the vectors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from faste_mm.cli.common import (DEFAULT_MODEL, DOCUMENT_R_MAX, Format, chosen_format, debug_option, device_option, fail,
                                 format_option, legacy_json_option, setup_logging, stderr, stdout, unpadded_option)
from faste_mm.cli.progress import Progress
from faste_mm.errors import ConfigError, FasteError

def embed(
    paths: list[Path] = typer.Argument(None, help="Image, PDF and .txt/.md files or folders (walked recursively)."),
    text: list[str] = typer.Option([], "--text", "-t", help="A text to embed; repeatable."),
    model: str = typer.Option(DEFAULT_MODEL, envvar="FASTE_MM_MODEL", help="Hub id or local model directory."),
    r_max: Optional[float] = typer.Option(None, envvar="FASTE_MM_R_MAX",
                                          help=f"FastE: largest share of prefix tokens removed, 0 <= r < 1 (0 = full "
                                               f"forward). Default: {DOCUMENT_R_MAX:g} for documents, as index; 0 with "
                                               f"--instruction (queries run the full forward)."),
    warmup_layer: Optional[int] = typer.Option(None, envvar="FASTE_MM_WARMUP_LAYER", help="FastE warm-up layer l_w (default: the backbone's, 8)."),
    threshold: Optional[float] = typer.Option(None, envvar="FASTE_MM_THRESHOLD", help="FastE alignment threshold theta (default: the backbone's)."),
    trigger_layer: Optional[int] = typer.Option(None, envvar="FASTE_MM_TRIGGER_LAYER", help="Compress before this layer instead of the alignment trigger."),
    instruction: Optional[str] = typer.Option(None, envvar="FASTE_MM_INSTRUCTION", help="Task instruction (queries); default: the document format."),
    dim: Optional[int] = typer.Option(None, envvar="FASTE_MM_DIM", min=1, help="Matryoshka dimensions kept (default: all)."),
    batch_tokens: int = typer.Option(16384, envvar="FASTE_MM_BATCH_TOKENS", help="Padded tokens per batch."),
    unpadded: str = unpadded_option(),
    device: str = device_option(),
    dtype: str = typer.Option("auto", envvar="FASTE_MM_DTYPE", help="auto (bfloat16 on CUDA, float32 on CPU) | float32 | bfloat16 | float16."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", envvar="FASTE_MM_OUT", help="Write the embeddings (float32, one row per item) to this .npy file."),
    output: Format = format_option("The summary on stdout as a table or as JSON (default table)."),
    legacy_json: bool = legacy_json_option(),
    debug: bool = debug_option(),
) -> None:
    """Embed texts, images and PDF pages; print stats (removal, FLOPs, trigger layer, timings)."""
    from faste_mm import BatchingConfig, Embedder, FastEConfig
    from faste_mm.retrieval.ingest import document_items

    setup_logging(debug)
    output = chosen_format(output, legacy_json)
    if r_max is None:  # documents get the documented default; queries (an instruction) the full forward
        r_max = 0.0 if instruction is not None else DOCUMENT_R_MAX
    try:
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
        fast_e = None
        if r_max != 0 or trigger_layer is not None:  # FastEConfig also refuses a negative r_max
            fast_e = FastEConfig(r_max=r_max, warmup_layer=warmup_layer, threshold=threshold, trigger_layer=trigger_layer)
        with Progress().loading(model):
            embedder = Embedder.from_pretrained(model, device=device, dtype=dtype,
                                                batching=BatchingConfig(batch_tokens=batch_tokens, unpadded=unpadded))
        result = embedder.encode(inputs, fast_e=fast_e, instruction=instruction, dim=dim, on_error="skip")
        if out is not None and result.ok.any():
            import numpy as np

            try:
                np.save(out, result.embeddings)
            except OSError as error:
                raise ConfigError(f"--out {out}: cannot write the embeddings ({error}); choose another path") from None
    except FasteError as error:
        fail(error, debug)
    summary = {
        "model": embedder.model_id,
        "items": [
            {"index": i, "item": item.describe(), "page": item.page, "ok": bool(ok)}
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
        ("model forward (s)", f"{stats['forward_s']:.2f}"),
        ("end to end (s)", f"{stats['total_s']:.2f}"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    stdout.print(table)

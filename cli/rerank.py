"""`faste-mm rerank`: score texts, images, PDF pages and videos against one query with a
reranker (Qwen3-VL-Reranker, Qwen3-Reranker) and print them best first."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from faste_mm.cli.common import fail, markup_safe, setup_logging, stderr, stdout
from faste_mm.cli.options import DEFAULT_RERANKER, Debug, Device, Dtype, Format, OutputFormat
from faste_mm.cli.progress import Progress
from faste_mm.errors import FasteError


def rerank_command(
    query: str = typer.Argument(..., help="The query text."),
    paths: list[Path] = typer.Argument(None, help="Candidate image, PDF, video and .txt/.md files or folders."),
    text: list[str] = typer.Option([], "--text", "-t", help="A candidate text; repeatable."),
    model: str = typer.Option(DEFAULT_RERANKER, "--model", envvar="FASTE_MM_RERANK", help=f"Reranker hub id or folder. Default {DEFAULT_RERANKER}."),
    top_n: Optional[int] = typer.Option(None, "--top-n", min=0, envvar="FASTE_MM_TOP_N", help="Print the best N (default: all)."),
    r_max: float = typer.Option(0.0, "--r-max", envvar="FASTE_MM_RERANK_R_MAX", help="FastE on every pair: largest share of prefix tokens removed, 0 <= r < 1. Default 0 (the exact score)."),
    protect: str = typer.Option("none", "--protect", envvar="FASTE_MM_RERANK_PROTECT", help="none | query: never evict the instruction + query. Default none."),
    instruction: Optional[str] = typer.Option(None, "--instruction", envvar="FASTE_MM_INSTRUCTION", help="The task (default: the reranker's official one)."),
    device: Device = "auto",
    dtype: Dtype = "auto",
    output: OutputFormat = Format.table,
    debug: Debug = False,
) -> None:
    """Rerank candidates for a query; print them best first with their scores."""
    from faste_mm import Reranker
    from faste_mm.retrieval.scanning import document_items

    setup_logging(debug)
    try:
        files, unreadable = document_items(paths) if paths else ([], [])
        for reason in unreadable:
            stderr.print(f"[yellow]skipped[/yellow] {markup_safe(reason)}")
        candidates = [*text, *files]
        if not candidates:
            raise typer.BadParameter("give at least one candidate PATH or --text")
        with Progress().loading(model):
            reranker = Reranker.from_pretrained(model, r_max=r_max, protect=protect, device=device, dtype=dtype)
        ranking = reranker.rerank(query, candidates, top_n=top_n, instruction=instruction)
    except FasteError as error:
        fail(error, debug)
    for failure in ranking.failures:
        stderr.print(f"[yellow]skipped[/yellow] {markup_safe(failure.reason)}")
    if output is Format.json:
        stdout.print_json(json.dumps({"model": reranker.model_id, "settings": reranker.settings(), **ranking.to_dict()}))
        return
    table = Table(title=f"faste-mm rerank ({reranker.model_id})")
    for column, justify in (("rank", "right"), ("score", "right"), ("candidate", "left")):
        table.add_column(column, justify=justify)
    for rank, result in enumerate(ranking.results, 1):
        table.add_row(str(rank), f"{result.score:.4f}", markup_safe(result.item.describe()))
    stdout.print(table)

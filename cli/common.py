"""Shared pieces of the CLI: consoles (results on stdout, messages on stderr) and error exit."""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from faste_mm.errors import FasteError

DEFAULT_MODEL = "Qwen/Qwen3-VL-Embedding-2B"
stderr = Console(stderr=True)
stdout = Console()


def fail(error: FasteError, debug: bool) -> NoReturn:
    """Exit 1 with the error's message (the traceback only with --debug)."""
    if debug:
        raise error
    stderr.print(f"[red]error:[/red] {escape(str(error))}")  # paths may contain [brackets]
    raise typer.Exit(1)

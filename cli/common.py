"""Shared pieces of the CLI: consoles (results on stdout, messages on stderr) and error exit."""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from faste_mm.errors import ConfigError, FasteError

DEFAULT_MODEL = "Qwen/Qwen3-VL-Embedding-2B"
stderr = Console(stderr=True)
stdout = Console()


def unpadded_option():
    """--unpadded, shared by the commands that embed (BatchingConfig.unpadded)."""
    return typer.Option(
        "auto", "--unpadded", envvar="FASTE_MM_UNPADDED",
        help="Layers after FastE compression: auto (CUDA: fastest of padded / flash-attn / torch-nested "
             "on a trial batch; CPU: segments) | off | flash-attn | torch-nested | segments. Default auto.",
    )


def image_root_option():
    """--image-root, shared by the commands that read MMEB data with --data (eval, calibrate)."""
    return typer.Option(
        None, "--image-root", envvar="FASTE_MM_IMAGE_ROOT",
        help="Folder the relative image paths start from (default: found under --data).",
    )


def parse_ratios(text: str, option: str = "--r-max") -> tuple[float, ...]:
    """Comma-separated removal ratios, e.g. "0,0.3,0.5,0.7" (ranges are checked by FastEConfig)."""
    try:
        return tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ConfigError(f"{option} takes comma-separated ratios in [0, 1), e.g. 0,0.3,0.5,0.7; got {text!r}") from None


def fail(error: FasteError, debug: bool) -> NoReturn:
    """Exit 1 with the error's message (the traceback only with --debug)."""
    if debug:
        raise error
    stderr.print(f"[red]error:[/red] {escape(str(error))}")  # paths may contain [brackets]
    raise typer.Exit(1)

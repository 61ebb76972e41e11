"""Shared pieces of the CLI: consoles (results on stdout, messages on stderr), the options every
command that loads a model or may fail declares (--device, --debug), logging set-up, error exit."""

from __future__ import annotations

import logging
import sys
from enum import Enum
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from faste_mm.errors import ConfigError, FasteError

DEFAULT_MODEL = "Qwen/Qwen3-VL-Embedding-2B"
# FastE's r_max for documents when the user gives none (index for a new collection, embed);
# queries always run the full forward.
DOCUMENT_R_MAX = 0.5
# soft_wrap: a message is never hard-wrapped at the console width (a piped stderr has no width,
# and rich would assume 80 columns and split paths and sentences across lines).
stderr = Console(stderr=True, soft_wrap=True)
stdout = Console(soft_wrap=True)


class Format(str, Enum):
    """What a command prints on stdout (files are written with --out)."""

    table = "table"
    json = "json"


def format_option(help: str = "Results on stdout as a table or as JSON (default table)."):
    """--format table|json, the one spelling of stdout's format on every command."""
    return typer.Option(Format.table, "--format", envvar="FASTE_MM_FORMAT", help=help)


def legacy_json_option():
    """--json, the old flag for --format json: hidden, still accepted, with a warning."""
    return typer.Option(False, "--json", hidden=True)


def chosen_format(output: Format, legacy_json: bool) -> Format:
    """--format, or json when the deprecated --json flag was given (said on stderr)."""
    if not legacy_json:
        return output
    deprecated("--json", "--format json")
    return Format.json


def deprecated(old: str, new: str) -> None:
    stderr.print(f"[yellow]warning:[/yellow] {old} is deprecated; use {new}", highlight=False)


def device_option():
    """--device, for every command that loads a model."""
    return typer.Option("auto", "--device", envvar="FASTE_MM_DEVICE", help="auto (CUDA when available) | cpu | cuda | cuda:N.")


def debug_option():
    """--debug, for every command that can fail."""
    return typer.Option(False, "--debug", envvar="FASTE_MM_DEBUG", help="Show tracebacks and debug logs.")


def setup_logging(debug: bool, level: int = logging.WARNING) -> None:
    """Library logs to stderr: `level` and above (DEBUG with --debug)."""
    logging.basicConfig(level=logging.DEBUG if debug else level, stream=sys.stderr,
                        format="%(levelname)s: %(message)s", force=True)


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
    """Exit 1 with the error's message in CLI words (`FasteError.cli_message`; the traceback
    only with --debug)."""
    if debug:
        raise error
    # CLI words, not the Python API's; paths may contain [brackets]
    stderr.print(f"[red]error:[/red] {escape(error.cli_message())}", highlight=False)
    raise typer.Exit(1)

"""Shared pieces of the CLI: consoles (results on stdout, messages on stderr), the options every
command that loads a model or may fail declares (--device, --debug), logging set-up, error exit."""

from __future__ import annotations

import json
import logging
import re
import sys
from enum import Enum
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from faste_mm.errors import ConfigError, FasteError
from faste_mm.retrieval.profile import DEFAULT_MODEL, DOCUMENT_R_MAX  # noqa: F401  (the documented defaults)

class _ResultConsole(Console):
    """stdout: a table printed to a pipe or a file is laid out at its natural width (rich would
    assume 80 columns and fold paths mid-name); on a terminal it fits the window, and a long
    path folds onto the next line."""

    def print(self, *objects, **kwargs) -> None:
        from rich.measure import Measurement
        from rich.table import Table

        tables = [o for o in objects if isinstance(o, Table)]
        if self.is_terminal or not tables:
            super().print(*objects, **kwargs)
            return
        natural = max(Measurement.get(self, self.options.update(width=1 << 16), t).maximum for t in tables)
        width, self._width = self._width, max(natural, self.width)  # rich caps print(width=) at its own
        try:
            super().print(*objects, **kwargs)
        finally:
            self._width = width


# soft_wrap: a message is never hard-wrapped at the console width (a piped stderr has no width,
# and rich would assume 80 columns and split paths and sentences across lines).
stderr = Console(stderr=True, soft_wrap=True)
stdout = _ResultConsole(soft_wrap=True)


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


class _StderrHandler(logging.StreamHandler):
    """Writes to the sys.stderr of the moment, not the one of set-up: while a progress bar is
    live, rich puts a proxy there that prints each line above the bar instead of into it."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # logging.StreamHandler sets it; the property decides
        pass


def setup_logging(debug: bool, level: int = logging.WARNING) -> None:
    """Library logs to stderr: `level` and above (DEBUG with --debug)."""
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    logging.basicConfig(level=logging.DEBUG if debug else level, handlers=[handler], force=True)


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


# Config fields as the CLI spells them: a ConfigError raised by a library dataclass names the
# field (`FastEConfig.r_max`); the user typed the flag.
_FLAGS = {
    "FastEConfig.r_max": "--r-max", "FastEConfig.threshold": "--threshold",
    "FastEConfig.warmup_layer": "--warmup-layer", "FastEConfig.trigger_layer": "--trigger-layer",
    "BatchingConfig.batch_tokens": "--batch-tokens", "BatchingConfig.unpadded": "--unpadded",
    "IndexOptions.chunk_files": "--chunk-files", "ScanFilter.exclude": "--exclude",
    "index_type": "--index-type", "ServeConfig.api_key": "--api-key",
    "VideoConfig.fps": "--video-fps", "VideoConfig.max_frames": "--video-max-frames",
    "VideoConfig.max_pixels": "--video-max-pixels",
}
_FLAG_RE = re.compile("|".join(rf"\b{re.escape(name)}\b" for name in _FLAGS))
# Any other config field is set by the flag of its name: `BenchConfig.repeats` -> --repeats.
_FIELD_RE = re.compile(r"\b[A-Z]\w*(?:Config|Options|Profile)\.([a-z][a-z0-9_]*)\b")
# Control characters (newlines, ANSI escapes) in a file name would break or recolour the output;
# bidirectional overrides (U+202E: "invoice\u202egpj.exe" shows as "invoiceexe.jpg") would disguise it.
_CONTROL_RE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def shown(text: object) -> str:
    """A user string (a file name, an error naming one) made safe to print: bytes that are not
    UTF-8 (kept by Python as lone surrogates) as \\xNN, control characters as escapes. Escape
    rich markup separately (`rich.markup.escape`) where the string goes into markup."""
    text = str(text)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return _CONTROL_RE.sub(lambda m: repr(m.group())[1:-1], text)


def markup_safe(text: object) -> str:
    """`shown(text)` with rich markup escaped: for table cells and messages printed by rich."""
    return escape(shown(text))


def print_json(payload: object) -> None:
    """JSON on stdout. When a name holds bytes that are not UTF-8 (lone surrogates), the whole
    document is written ASCII-escaped: json.loads turns \\udcXX back into the same str, and
    os.fsencode gives the original bytes; otherwise text is written as is."""
    try:
        json.dumps(payload, ensure_ascii=False).encode("utf-8")
        is_utf8 = True
    except UnicodeEncodeError:
        is_utf8 = False
    stdout.print_json(json.dumps(payload), ensure_ascii=not is_utf8)


def in_cli_words(message: str) -> str:
    """A library message with config field names replaced by the CLI flags that set them."""
    message = _FLAG_RE.sub(lambda m: _FLAGS[m.group()], message)
    return _FIELD_RE.sub(lambda m: "--" + m.group(1).replace("_", "-"), message)


def fail(error: FasteError, debug: bool) -> NoReturn:
    """Exit 1 with the error's message in CLI words (`FasteError.cli_message`; the traceback
    only with --debug)."""
    if debug:
        raise error
    # CLI words, not the Python API's (advice and field names); paths may contain [brackets]
    message = error.cli_message()
    if isinstance(error, ConfigError):
        message = in_cli_words(message)
    stderr.print(f"[red]error:[/red] {markup_safe(message)}", highlight=False)
    raise typer.Exit(1)

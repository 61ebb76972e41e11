"""Shared pieces of the CLI: consoles (results on stdout, messages on stderr), logging set-up,
errors in CLI words and the error exit. The shared options are declared in `cli/options.py`."""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from faste_mm.cli.setting_flags import FLAG_OF_FIELD
from faste_mm.errors import ConfigError, FasteError

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
    # Third-party chatter stays off the terminal unless --debug: the hub client's per-retry
    # warnings (its own handler printed each twice, once more through ours), LanceDB's Rust WARN
    # lines (read from LANCEDB_LOG when lancedb loads; a user's own setting wins).
    hub = logging.getLogger("huggingface_hub")
    hub.propagate = False
    hub.setLevel(logging.DEBUG if debug else logging.ERROR)
    os.environ.setdefault("LANCEDB_LOG", "info" if debug else "error")


# Config fields as the CLI spells them: a ConfigError raised by a library dataclass names the
# field (`FastEConfig.r_max`); the user typed the flag.
_FLAGS = {
    "FastEConfig.r_max": "--r-max", "FastEConfig.threshold": "--threshold",
    "FastEConfig.warmup_layer": "--warmup-layer", "FastEConfig.trigger_layer": "--trigger-layer",
    "BatchingConfig.batch_tokens": "--batch-tokens", "BatchingConfig.unpadded": "--unpadded",
    "IndexOptions.chunk_files": "--chunk-files", "IndexOptions.chunk_pages": "--chunk-pages",
    "ScanFilter.exclude": "--exclude",
    "index_type": "--index-type", "ServeConfig.api_key": "--api-key",
    "PlanConfig.dtypes": "--dtype", "PlanConfig.target": "--target", "PlanConfig.p5_floor": "--p5-floor",
    "PlanConfig.max_pixels": "--max-pixels",
    **FLAG_OF_FIELD,  # the collection settings' fields, from their declarations
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
    os.fsencode gives the original bytes; otherwise text is written as is. Colours only on a real
    terminal: FORCE_COLOR (set by many CI runners) makes rich colour a pipe, and `jq` would fail."""
    try:
        json.dumps(payload, ensure_ascii=False).encode("utf-8")
        is_utf8 = True
    except UnicodeEncodeError:
        is_utf8 = False
    stdout.print_json(json.dumps(payload), ensure_ascii=not is_utf8, highlight=_is_tty(sys.stdout))


def _is_tty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a replaced or closed stream
        return False


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


def usage_error(message: str) -> NoReturn:
    """Exit 2 (a usage error) with `message` on stderr: options that cannot go together."""
    stderr.print(f"[red]usage error:[/red] {message}")
    raise typer.Exit(2)

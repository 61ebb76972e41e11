"""The benchmark suites' one option system: every suite's options are argparse options declared
here once, with their help, and a suite adds the ones it takes (`add_shape(parser)`, ...); the
entry point (`faste_mm.bench.entry`) adds --out and --format to every suite and resolves
`--device auto`. --device and --dtype take the words and the "auto" default of every faste-mm
command (`faste_mm.model.cpu.machine`), and their FASTE_MM_DEVICE / FASTE_MM_DTYPE variables.
Importing this module loads no torch (`faste-mm bench SUITE --help` stays fast).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

from faste_mm.model.cpu.machine import DEVICE_CHOICES, DTYPE_CHOICES


def add_shape(parser: argparse.ArgumentParser, scale: float = 0.25, shape: str = "qwen3-vl-embedding-2b") -> None:
    """--shape (a random-weight real architecture, faste_mm.tools.shapes) and --scale-hidden."""
    from faste_mm.tools.shapes import SHAPES  # torch: only when a suite's parser is built

    parser.add_argument("--shape", default=shape, choices=sorted(SHAPES),
                        help=f"random-weight real architecture (default {shape})")
    parser.add_argument("--scale-hidden", "--scale", dest="scale_hidden", type=float, default=scale,
                        help=f"shrink the shape's widths by this factor, layers and heads kept (default {scale:g}; 1 = the real width)")


def add_model(parser: argparse.ArgumentParser, what: str = "embedding model") -> None:
    """--model: a local checkpoint directory to measure instead of building --shape."""
    parser.add_argument("--model", type=Path, default=None,
                        help=f"a local {what} directory to measure instead of building --shape (default: build it)")


def add_device(parser: argparse.ArgumentParser, dtype: bool = True, where: str = "") -> None:
    """--device (default auto: CUDA when available; the entry point resolves it before the suite
    runs) and, with `dtype`, --dtype (`add_dtype`). `where`: what runs there, when not everything does."""
    parser.add_argument("--device", default=os.environ.get("FASTE_MM_DEVICE", "auto"),
                        help=f"{DEVICE_CHOICES}{where}. Default auto (env FASTE_MM_DEVICE)")
    if dtype:
        add_dtype(parser)


def add_dtype(parser: argparse.ArgumentParser, default: str = "auto", what: str = "Model weights and compute") -> None:
    """--dtype, in the words of every faste-mm command; `default` where a suite compares at another."""
    given = os.environ.get("FASTE_MM_DTYPE", default)
    parser.add_argument("--dtype", default=given, help=f"{what}: {DTYPE_CHOICES}. Default {default} (env FASTE_MM_DTYPE)")


def add_rounds(parser: argparse.ArgumentParser, default: int | None = 2, shown: str | None = None) -> None:
    """--repeats (alias --rounds): timed mirrored rounds after the warm-up (faste_mm.bench.rounds).
    `shown`: the default as --help says it, where the suite resolves None itself."""
    parser.add_argument("--repeats", "--rounds", dest="repeats", type=int, default=default,
                        help=f"timed rounds, the order mirrored every other round (default {shown or default}; an even count cancels a linear load drift)")


def add_threads(parser: argparse.ArgumentParser, default: int | None = None) -> None:
    parser.add_argument("--threads", type=int, default=default,
                        help="torch CPU threads (default: torch's own); 1 on a shared, oversubscribed CPU")


# The input spec language of faste_mm.bench.inputs, as --inputs says it (the model suite's too).
INPUTS_WORDS = "text:TOKENS | text:MIN-MAX | image:WxH | page:WxH | video:SECONDS[@WxH] | a folder"
# --out and --format, every suite's (the entry point adds them; the model suite declares them alike).
OUT_HELP = "also write the result (JSON, faste_mm.bench.schema) to this file"
FORMAT_HELP = "stdout: the suite's table (default) or the result JSON"


def add_inputs(parser: argparse.ArgumentParser, default: str, n: int | None = None) -> None:
    """--inputs (faste_mm.bench.inputs: text:TOKENS, text:MIN-MAX, image:WxH, page:WxH, video:S) and --n."""
    parser.add_argument("--inputs", default=default, help=f"{INPUTS_WORDS} (default {default})")
    if n is not None:
        parser.add_argument("--n", type=int, default=n, help=f"number of inputs (default {n})")


def add_output(parser: argparse.ArgumentParser) -> None:
    """--out (env FASTE_MM_BENCH_OUT) and --format: every suite's, added by the entry point."""
    out = os.environ.get("FASTE_MM_BENCH_OUT")
    parser.add_argument("--out", "-o", type=Path, default=Path(out) if out else None, help=OUT_HELP)
    parser.add_argument("--format", dest="output", choices=("table", "json"), default="table", help=FORMAT_HELP)


def resolve_device(args: argparse.Namespace) -> None:
    """--device auto as every faste-mm command reads it (CUDA when available, else the CPU), in
    place, before the suite runs: a suite hands its device on as a concrete one."""
    if getattr(args, "device", None) == "auto":
        from faste_mm.model.backbones.loading import resolve_device as resolved

        args.device = str(resolved("auto"))


def add_workdir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workdir", type=Path, default=None, help="folder for models, inputs and collections (default: a temporary one)")


@contextlib.contextmanager
def scratch(given: Path | None, prefix: str):
    """The suite's working folder: --workdir as given (kept), else a temporary one removed when the
    suite ends, however it ends (a real-width model written there takes gigabytes)."""
    if given is not None:
        yield given
        return
    with tempfile.TemporaryDirectory(prefix=prefix) as folder:
        yield Path(folder)


def apply_threads(args: argparse.Namespace) -> None:
    """Set torch's threads from --threads (before any model runs)."""
    if getattr(args, "threads", None):
        import torch

        torch.set_num_threads(args.threads)


def ints(text: str) -> list[int]:
    """"1,4,16" -> [1, 4, 16]."""
    return [int(part) for part in text.split(",") if part.strip()]


def floats(text: str) -> list[float]:
    return [float(part) for part in text.split(",") if part.strip()]


def names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def faste_mm_command(given: str | None = None) -> list[str]:
    """The command that runs faste-mm in a new process: `given`, else the faste-mm beside this
    Python (its venv's, whether or not the venv is on PATH), else the one on PATH, else this
    Python with -m."""
    if given:
        return [given]
    beside = Path(sys.executable).with_name("faste-mm")
    if beside.exists():
        return [str(beside)]
    found = shutil.which("faste-mm")
    return [found] if found else [sys.executable, "-m", "faste_mm.cli.app"]

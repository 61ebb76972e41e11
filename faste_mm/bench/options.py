"""The benchmark suites' shared option declarations: each option is declared here once, with its
help, and a suite adds the ones it takes (`add_shape(parser)`, ...). The entry point
(`faste_mm.bench.entry`) adds --out and --format to every suite."""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import tempfile
from pathlib import Path

from faste_mm.tools.shapes import SHAPES


def add_shape(parser: argparse.ArgumentParser, scale: float = 0.25, shape: str = "qwen3-vl-embedding-2b") -> None:
    """--shape (a random-weight real architecture, faste_mm.tools.shapes) and --scale-hidden."""
    parser.add_argument("--shape", default=shape, choices=sorted(SHAPES),
                        help=f"random-weight real architecture (default {shape})")
    parser.add_argument("--scale-hidden", "--scale", dest="scale_hidden", type=float, default=scale,
                        help=f"shrink the shape's widths by this factor, layers and heads kept (default {scale:g}; 1 = the real width)")


def add_model(parser: argparse.ArgumentParser, what: str = "embedding model") -> None:
    """--model: a local checkpoint directory to measure instead of building --shape."""
    parser.add_argument("--model", type=Path, default=None,
                        help=f"a local {what} directory to measure instead of building --shape (default: build it)")


def add_device(parser: argparse.ArgumentParser, dtype: bool = True) -> None:
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    if dtype:
        parser.add_argument("--dtype", default="auto",
                            help="auto (bfloat16 where the CPU multiplies it natively, or on CUDA), float32, bfloat16 (default auto)")


def add_rounds(parser: argparse.ArgumentParser, default: int | None = 2, shown: str | None = None) -> None:
    """--repeats (alias --rounds): timed mirrored rounds after the warm-up (faste_mm.bench.rounds).
    `shown`: the default as --help says it, where the suite resolves None itself."""
    parser.add_argument("--repeats", "--rounds", dest="repeats", type=int, default=default,
                        help=f"timed rounds, the order mirrored every other round (default {shown or default}; an even count cancels a linear load drift)")


def add_threads(parser: argparse.ArgumentParser, default: int | None = None) -> None:
    parser.add_argument("--threads", type=int, default=default,
                        help="torch CPU threads (default: torch's own); 1 on a shared, oversubscribed CPU")


def add_inputs(parser: argparse.ArgumentParser, default: str, n: int | None = None) -> None:
    """--inputs (faste_mm.bench.inputs: text:TOKENS, text:MIN-MAX, image:WxH, page:WxH, video:S) and --n."""
    parser.add_argument("--inputs", default=default,
                        help=f"text:TOKENS | text:MIN-MAX | image:WxH | page:WxH | video:SECONDS[@WxH] (default {default})")
    if n is not None:
        parser.add_argument("--n", type=int, default=n, help=f"number of inputs (default {n})")


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

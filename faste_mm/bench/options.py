"""The benchmark suites' one option system: every suite's options, the model suite's among them,
are argparse options declared here once, with their help, and a suite adds the ones it takes
(`add_shape(parser)`, ...); the entry point (`faste_mm.bench.entry`) adds --out, --format and
--debug to every suite and resolves `--device auto`. --device and --dtype take the words and the
"auto" default of every faste-mm command (`faste_mm.model.cpu.machine`), the FastE flags are the
collection settings' own declarations (`faste_mm.retrieval.profile`), and each reads its FASTE_MM_*
variable as the CLI's commands do (FASTE_MM_DEVICE, FASTE_MM_DTYPE, FASTE_MM_BENCH_OUT,
FASTE_MM_FORMAT, FASTE_MM_DEBUG for every suite; `env=True` where a suite documents the others).
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

from faste_mm.model.cpu.machine import BATCH_TOKENS_DEFAULT, DEVICE_CHOICES, DTYPE_CHOICES, UNPADDED_CHOICES


def from_env(flag: str, default=None, env: bool = True):
    """`flag`'s default for this run: its variable (FASTE_MM_ + the flag's name: --scale-hidden ->
    FASTE_MM_SCALE_HIDDEN) when `env` and set, else `default`. argparse parses a text default
    with the option's type, so a variable is read as the flag would be."""
    return os.environ.get(env_name(flag), default) if env else default


def env_name(flag: str) -> str:
    return "FASTE_MM_" + flag.lstrip("-").replace("-", "_").upper()


def _said(default, env: bool, flag: str) -> str:
    """The help's default clause: `default` and, where it reads one, the flag's variable."""
    return f"default {default}" + (f"; env {env_name(flag)}" if env else "")


def add_shape(parser: argparse.ArgumentParser, scale: float = 0.25, shape: str | None = "qwen3-vl-embedding-2b",
              env: bool = False) -> None:
    """--shape (a random-weight real architecture, faste_mm.tools.shapes) and --scale-hidden;
    `shape` None: not built unless given (the suite then needs --model)."""
    from faste_mm.tools.shapes import SHAPES  # torch: only when a suite's parser is built

    parser.add_argument("--shape", default=from_env("--shape", shape, env), choices=sorted(SHAPES),
                        help=f"random-weight real architecture ({_said(shape or 'none: give it or --model', env, '--shape')})")
    parser.add_argument("--scale-hidden", "--scale", dest="scale_hidden", type=float,
                        default=from_env("--scale-hidden", scale, env),
                        help=f"shrink the shape's widths by this factor, layers and heads kept "
                             f"({_said(f'{scale:g}', env, '--scale-hidden')}; 1 = the real width)")


def add_model(parser: argparse.ArgumentParser, what: str = "embedding model", env: bool = False) -> None:
    """--model: a checkpoint to measure instead of building --shape."""
    where = "hub id or local" if env else "local"  # only the model suite (env=True) loads from the hub
    parser.add_argument("--model", type=Path, default=from_env("--model", None, env),
                        help=f"a {where} {what} directory to measure instead of building --shape "
                             f"({_said('none: build it', env, '--model')})")


def add_settings(parser: argparse.ArgumentParser, *flags: str, sweep: bool = False) -> None:
    """Collection-setting flags (--r-max, --warmup-layer, --threshold, --trigger-layer,
    --patch-dedup, ...) as every faste-mm command declares them (`CollectionProfile`'s settings):
    the same help, FASTE_MM_* variable and bounds. `sweep`: --r-max takes comma-separated ratios."""
    from faste_mm.retrieval.profile import CollectionProfile
    from faste_mm.retrieval.setting import settings_of

    declared = {flag.name: flag for s in settings_of(CollectionProfile).values() for flag in s.flags}
    for name in flags:
        flag = declared[name]
        kind = _ratios if sweep and name == "--r-max" else _bounded(flag.type, flag.min, flag.max)
        parser.add_argument(flag.name, type=kind, default=from_env(flag.name),
                            help=f"{flag.help} (env {flag.envvar})".replace("%", "%%"))


def add_batching(parser: argparse.ArgumentParser, sweep_unpadded: bool = False) -> None:
    """--batch-tokens and --unpadded in every faste-mm command's words (`sweep_unpadded`: several
    layouts, comma-separated, each measured), with their FASTE_MM_* variables."""
    parser.add_argument("--batch-tokens", type=_bounded(int, 1), default=from_env("--batch-tokens"),
                        help=f"padded tokens per model batch. {BATCH_TOKENS_DEFAULT} (env FASTE_MM_BATCH_TOKENS)")
    several = "; several, comma-separated, are each measured" if sweep_unpadded else ""
    parser.add_argument("--unpadded", default=from_env("--unpadded", "auto"),
                        help=f"layers after FastE compression: {UNPADDED_CHOICES}{several}. Default auto (env FASTE_MM_UNPADDED)")


def _bounded(kind: type, low: float | None = None, high: float | None = None):
    """An argparse type: `kind`, within [low, high]; out of range is a usage error (naming the flag)."""
    def parse(text: str):
        value = kind(text)
        if (low is not None and value < low) or (high is not None and value > high):
            bounds = f">= {low:g}" if high is None else f"in [{low:g}, {high:g}]" if low is not None else f"<= {high:g}"
            raise argparse.ArgumentTypeError(f"must be {bounds}, got {text}")  # argparse names the flag
        return value
    parse.__name__ = kind.__name__  # argparse names the type in "invalid int value"
    return parse


def _ratios(text: str) -> tuple[float, ...]:
    """--r-max as a sweep: "0,0.3,0.5,0.7", each in [0, 1)."""
    try:
        values = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        values = ()
    if not values or not all(0 <= v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"ratios in [0, 1), comma-separated for a sweep, e.g. 0,0.3,0.5,0.7; got {text!r}")
    return values


def add_device(parser: argparse.ArgumentParser, dtype: bool = True, where: str = "") -> None:
    """--device (default auto: CUDA when available; the entry point resolves it before the suite
    runs) and, with `dtype`, --dtype (`add_dtype`). `where`: what runs there, when not everything does."""
    parser.add_argument("--device", default=from_env("--device", "auto"),
                        help=f"{DEVICE_CHOICES}{where}. Default auto (env FASTE_MM_DEVICE)")
    if dtype:
        add_dtype(parser)


def add_dtype(parser: argparse.ArgumentParser, default: str = "auto", what: str = "Model weights and compute") -> None:
    """--dtype, in the words of every faste-mm command; `default` where a suite compares at another."""
    parser.add_argument("--dtype", default=from_env("--dtype", default),
                        help=f"{what}: {DTYPE_CHOICES}. Default {default} (env FASTE_MM_DTYPE)")


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


def add_inputs(parser: argparse.ArgumentParser, default: str, n: int | None = None, env: bool = False) -> None:
    """--inputs (faste_mm.bench.inputs: text:TOKENS, text:MIN-MAX, image:WxH, page:WxH, video:S) and --n."""
    parser.add_argument("--inputs", default=from_env("--inputs", default, env),
                        help=f"{INPUTS_WORDS} ({_said(default, env, '--inputs')})")
    if n is not None:
        parser.add_argument("--n", type=_bounded(int, 1), default=from_env("--n", n, env),
                            help=f"number of inputs ({_said(n, env, '--n')})")


def add_output(parser: argparse.ArgumentParser) -> None:
    """--out (env FASTE_MM_BENCH_OUT), --format and --debug: every suite's, added by the entry point."""
    parser.add_argument("--out", "-o", type=Path, default=os.environ.get("FASTE_MM_BENCH_OUT"),
                        help=f"{OUT_HELP} (env FASTE_MM_BENCH_OUT)")
    parser.add_argument("--format", dest="output", choices=("table", "json"), default=from_env("--format", "table"),
                        help=f"{FORMAT_HELP} (env FASTE_MM_FORMAT)")
    parser.add_argument("--debug", action="store_true", default=from_env("--debug", "") not in ("", "0", "false", "no", "off"),
                        help="show the traceback of an error and debug logs (env FASTE_MM_DEBUG)")


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

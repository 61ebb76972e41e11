"""The one result schema of every benchmark suite: what ran (suite, command line, commit), where
(device, CPU model and flags, cores, torch version and threads, dtype), under which load (the
1/5/15-minute load averages at start and at end), then the suite's settings and rows. A suite
hands back a `SuiteRun`; `finish` wraps it into a `BenchResult` whose `to_dict()` is the JSON
that `--out` writes and `--format json` prints.

`machine` is the calibration block: what this machine can do at best (a roofline GEMM's TFLOP/s,
memory bandwidth, ...), measured beside the suite's figures so a ratio can be read against the
machine's own ceiling. Suites that calibrate fill it; it stays empty otherwise.
"""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
import time
import types
import typing
from dataclasses import asdict, dataclass, field, fields
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping

from faste_mm.model.cpu.machine import read_cpu_flags
from faste_mm.model.cpu.machine_plan import available_cores

SCHEMA = "faste-mm-bench/1"
# The flags that decide a CPU's speed on our kernels: bfloat16 and int8 matrix units.
RECORDED_CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8", "amx_tile")
_SOURCE = Path(__file__).resolve().parents[2]  # the checkout (or site-packages) holding faste_mm/


@dataclass(frozen=True, slots=True)
class SuiteRun:
    """What a suite measured: `rows` (one dict per measured setting or case, JSON values),
    `params` (the suite's settings as run: sizes, shapes, rounds), the `device` and `dtype` it
    ran on (None where it does not apply), `machine` (the calibration block, see the module
    docstring), and `text` (a Markdown table for people; not part of the JSON)."""

    rows: list[dict]
    params: dict = field(default_factory=dict)
    device: str | None = None
    dtype: str | None = None
    machine: dict = field(default_factory=dict)
    text: str = ""


@dataclass(frozen=True, slots=True)
class Start:
    """The facts taken before a suite runs (`start`): wall clock, load, command line."""

    started_at: str
    started: float
    load_start: tuple[float, float, float]
    command: str


@dataclass(frozen=True, slots=True)
class BenchResult:
    """One run of one suite (see the module docstring); `to_dict()` is its JSON."""

    suite: str
    commit: str | None            # git commit of the code measured ("-dirty" with local changes), None outside a checkout
    command: str                  # the command line, shell-quoted
    started_at: str               # UTC, ISO 8601
    wall_s: float                 # the whole run, set-up included
    device: str | None            # "CPU x86_64 x2 (torch threads 2)", a GPU's name, ...
    cpu: str                      # the CPU model (/proc/cpuinfo "model name")
    cores: int
    cpu_flags: dict[str, bool]    # RECORDED_CPU_FLAGS -> present
    dtype: str | None
    torch: str | None             # installed torch version (read without importing it)
    threads: int | None           # torch's intra-op threads at the end (None where torch never loaded)
    load_start: tuple[float, float, float]  # os.getloadavg(): 1, 5, 15 minutes
    load_end: tuple[float, float, float]
    params: dict
    machine: dict                 # calibration block (roofline GEMM, bandwidth): empty unless measured
    rows: list[dict]
    schema: str = SCHEMA

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "result") -> "BenchResult":
        """A result's JSON (`to_dict`, read back) as a `BenchResult`, checked against the schema:
        the same keys, `schema` equal to SCHEMA, each value of its field's type. Raises
        ConfigError naming `where` (a file) and the first field that breaks it."""
        from faste_mm.errors import ConfigError

        if not isinstance(data, Mapping):
            raise ConfigError(f"{where}: a bench result is a JSON object, got {type(data).__name__}")
        names = [f.name for f in fields(cls)]
        missing, unknown = sorted(set(names) - set(data)), sorted(set(data) - set(names))
        if missing or unknown:
            raise ConfigError(f"{where}: not the bench result schema {SCHEMA} (missing {missing}, unknown {unknown}); "
                              f"an older result belongs in docs/bench/archive/")
        if data["schema"] != SCHEMA:
            raise ConfigError(f"{where}: schema {data['schema']!r}, expected {SCHEMA!r}")
        hints = typing.get_type_hints(cls)
        for name in names:
            if not _conforms(data[name], hints[name]):
                raise ConfigError(f"{where}: field {name!r} must be {hints[name]}, got {data[name]!r:.80}")
        return cls(**{name: tuple(data[name]) if name.startswith("load_") else data[name] for name in names})


def start(args: list[str] | None = None, prog: str | None = None) -> Start:
    """Record the start of a run: the time, the load average and the command line (`prog` and
    its `args`; default: this process's own, sys.argv)."""
    if args is None:
        prog, args = Path(sys.argv[0]).name, sys.argv[1:]
    command = " ".join(part for part in (prog, shlex.join(args)) if part)
    return Start(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), time.perf_counter(), _load(), command)


def finish(suite: str, begun: Start, run: SuiteRun) -> BenchResult:
    """The result of `run`, with the machine's facts read now (the load at the end among them)."""
    torch = sys.modules.get("torch")  # a suite that never loaded torch (the client) has no threads to report
    return BenchResult(
        suite=suite, commit=commit(), command=begun.command, started_at=begun.started_at,
        wall_s=round(time.perf_counter() - begun.started, 3), device=run.device, cpu=cpu_model(),
        cores=available_cores()[0], cpu_flags=cpu_flags(), dtype=run.dtype, torch=_version("torch"),
        threads=None if torch is None else torch.get_num_threads(), load_start=begun.load_start,
        load_end=_load(), params=run.params, machine=run.machine, rows=run.rows)


def cpu_flags() -> dict[str, bool]:
    flags = read_cpu_flags()
    return {flag: flag in flags for flag in RECORDED_CPU_FLAGS}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def commit() -> str | None:
    """The git commit of the checkout holding this code, "-dirty" when it has uncommitted changes
    to tracked files; None when the code is not in a git checkout (an installed wheel)."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(_SOURCE), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    head = git("rev-parse", "--short=12", "HEAD")
    if head is None:
        return None
    return head + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def describe(result: BenchResult) -> str:
    """One line for people: the facts every figure needs beside it."""
    flags = " ".join(flag for flag, present in result.cpu_flags.items() if present) or "none of the recorded flags"
    load = lambda values: "/".join(f"{v:.1f}" for v in values)  # noqa: E731
    return (f"faste-mm bench {result.suite} at {result.commit or 'an unknown commit'} on {result.device or result.cpu} "
            f"({result.cpu}, {result.cores} cores; {flags}); dtype {result.dtype or '-'}, torch {result.torch or '-'}, "
            f"threads {result.threads if result.threads is not None else '-'}; load {load(result.load_start)} at start, "
            f"{load(result.load_end)} at end; {result.wall_s:.1f} s")


def _conforms(value: Any, hint: Any) -> bool:
    """Whether a JSON value fits a field's type hint (JSON arrays stand for tuples)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, arg) for arg in args)
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is tuple:
        return isinstance(value, (list, tuple)) and len(value) == len(args) and all(
            _conforms(item, arg) for item, arg in zip(value, args))
    if origin is list:
        return isinstance(value, list) and all(_conforms(item, args[0]) for item in value)
    if origin is dict:
        return isinstance(value, dict) and all(
            _conforms(k, args[0]) and _conforms(v, args[1]) for k, v in value.items())
    return isinstance(value, origin or hint)


def _load() -> tuple[float, float, float]:
    try:
        return tuple(round(x, 2) for x in os.getloadavg())
    except OSError:  # not on this platform
        return (0.0, 0.0, 0.0)


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None

"""Wall time of CLI start-up: `faste-mm --help`, `--version` and `info` on a small collection,
each run in a new process several times (median, min, max), as a person typing them feels it.

    faste-mm bench startup [--faste-mm PATH] [--repeats 7]

--faste-mm picks the executable (e.g. another checkout's venv) to compare before and after.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from faste_mm.bench.options import faste_mm_command
from faste_mm.bench.schema import SuiteRun
from faste_mm.errors import ConfigError


def _collection(workdir: Path) -> Path:
    """A one-vector collection written through the indexers alone (no model needed)."""
    import numpy as np

    from faste_mm.indexers import Collection, ItemRecord, Manifest

    root = workdir / "col"
    with Collection.create(root, Manifest(model_id="bench", dim=8)) as col:
        vector = np.ones((1, 8), dtype=np.float32) / np.sqrt(8)
        col.add(vector, [ItemRecord(uri="/bench/a.png", modality="image")])
    return root


def _time(argv: list[str], repeats: int) -> dict:
    subprocess.run(argv, capture_output=True, check=False)  # warm the page cache once
    runs = []
    for _ in range(repeats):
        started = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, check=False)
        runs.append(time.perf_counter() - started)
        if done.returncode != 0:
            raise ConfigError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.decode()[-400:]}")
    return {"median_s": statistics.median(runs), "min_s": min(runs), "max_s": max(runs), "runs": len(runs)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--faste-mm", dest="faste_mm", default=None,
                        help="the executable to time (default: the faste-mm beside this Python, else on PATH)")
    parser.add_argument("--repeats", type=int, default=7, help="runs per command (default 7)")


def run(args: argparse.Namespace) -> SuiteRun:
    with tempfile.TemporaryDirectory() as tmp:
        col = _collection(Path(tmp))
        commands = {"--help": ["--help"], "--version": ["--version"], "info": ["info", "-c", str(col)]}
        executable = faste_mm_command(args.faste_mm)
        rows = [{"command": name, **_time([*executable, *rest], args.repeats)} for name, rest in commands.items()]
    text = "\n".join(["| command | median s | min s | max s | runs |", "|---|---:|---:|---:|---:|",
                      *(f"| faste-mm {r['command']} | {r['median_s']:.3f} | {r['min_s']:.3f} | {r['max_s']:.3f} | {r['runs']} |"
                        for r in rows)])
    return SuiteRun(rows, {"executable": executable, "repeats": args.repeats}, "cpu", text=text)

"""Wall time of CLI start-up: `faste-mm --help`, `--version` and `info` on a small collection,
each run in a new process several times (median, min, max), as a person typing them feels it.

    python scripts/bench_startup.py [--faste-mm PATH] [--repeats 7] [--json OUT]

--faste-mm picks the executable (e.g. another checkout's venv) to compare before and after.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


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
            raise SystemExit(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.decode()[-400:]}")
    return {"median_s": statistics.median(runs), "min_s": min(runs), "max_s": max(runs), "runs": len(runs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--faste-mm", default=shutil.which("faste-mm") or "faste-mm", help="the executable to time")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        col = _collection(Path(tmp))
        commands = {"--help": ["--help"], "--version": ["--version"], "info": ["info", "-c", str(col)]}
        results = {}
        for name, rest in commands.items():
            try:
                results[name] = _time([args.faste_mm, *rest], args.repeats)
            except SystemExit as error:
                results[name] = {"error": str(error)}
    for name, result in results.items():
        if "error" in result:
            print(f"{name:10s} {result['error']}", file=sys.stderr)
        else:
            print(f"{name:10s} median {result['median_s']:.3f} s  (min {result['min_s']:.3f}, max {result['max_s']:.3f}, {result['runs']} runs)")
    if args.json:
        args.json.write_text(json.dumps({"executable": args.faste_mm, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()

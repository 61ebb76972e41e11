"""Photo features' costs in the bench tool's schema (mirrored rounds, one process): facts read per
photo against its sha256, and a date-range search against the unfiltered one. Writes JSON to --out.

    python scripts/bench_photos.py --photos 40 --n 100000 --dim 512 --out docs/bench/photos-cpu.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from faste_mm.bench.rounds import mirrored_rounds
from faste_mm.bench.schema import SuiteRun, describe, finish, start
from faste_mm.tools import photo_costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--photos", type=int, default=40, help="photos read per round (4032x3024 JPEGs)")
    parser.add_argument("--n", type=int, default=100_000, help="vectors in the dated collection")
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--queries", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    begun = start()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        paths = photo_costs.write_photos(Path(tmp) / "photos", args.photos)
        timed = mirrored_rounds(photo_costs.metadata_contenders(paths), args.rounds)
        size = sum(p.stat().st_size for p in paths) / len(paths)
        for name, t in timed.items():
            rows.append({"case": f"per photo: {name}", "ms_median": 1000 * t.median / len(paths),
                         "ms_best": 1000 * t.best / len(paths), "photo_bytes": round(size)})
        col = photo_costs.dated_collection(Path(tmp) / "col", args.n, args.dim)
        queries = np.random.default_rng(1).standard_normal((args.queries, args.dim)).astype(np.float32)
        queries /= np.linalg.norm(queries, axis=1, keepdims=True)
        timed = mirrored_rounds(photo_costs.search_contenders(col, queries, 10, (0.01, 0.1, 0.5)), args.rounds)
        base = timed["unfiltered"].median
        for name, t in timed.items():
            rows.append({"case": f"search {args.queries} queries, k=10: {name}", "ms_median": 1000 * t.median / args.queries,
                         "over_unfiltered": t.median / base, "n": args.n, "dim": args.dim,
                         "factory": col.manifest.index_factory})
        col.close()
    text = "\n".join(f"{r['case']}: {r['ms_median']:.3f} ms" + (f" ({r['over_unfiltered']:.2f}x)" if "over_unfiltered" in r
                                                                 else "") for r in rows)
    result = finish("photos", begun, SuiteRun(rows=rows, params=vars(args) | {"out": str(args.out)}, device="cpu",
                                              dtype=None, machine={}, text=text))
    print(text)
    print(describe(result))
    if args.out is not None:
        args.out.write_text(json.dumps(result.to_dict(), indent=2) + "\n")


if __name__ == "__main__":
    main()

"""What keeping albums current costs an index run (faste_mm/retrieval/library/albums.py): a collection of
N synthetic stored vectors with a few albums, then rounds of new items committed and `refresh_albums`
timed; the refresh's milliseconds per new item, and the first scoring of all N when an album is made.

    faste-mm bench album-refresh [--n 10000,100000] [--new 1000] [--albums 3] [--rounds 5]

No model: the albums' query vectors are synthetic too (the refresh never embeds; it scores the new
items' stored vectors and writes their rows). Each album's filter differs (none, a kind, a path glob),
as a library's do; its rows and members are committed in one transaction, which the time includes.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from faste_mm.bench.options import add_rounds, add_workdir, ints, scratch
from faste_mm.bench.schema import SuiteRun

# (name, filter) of the albums a collection gets, in this order (--albums takes the first ones, cycling).
FILTERS = (("all", {}), ("pictures", {"types": ("image",)}), ("trips", {"path": "/bench/trip/*"}))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--n", type=ints, default=[10_000, 100_000],
                        help="items in the collection before the timed rounds, comma-separated (default 10000,100000)")
    parser.add_argument("--new", type=int, default=1000, help="new items committed before each refresh (default 1000)")
    parser.add_argument("--albums", type=int, default=3, help="albums of the collection (default 3: no filter, a kind, a path)")
    parser.add_argument("--limit", type=int, default=100, help="members per album (default 100)")
    parser.add_argument("--dim", type=int, default=2048, help="vector width (default 2048, Qwen3-VL-Embedding-2B's)")
    add_rounds(parser, default=5)
    add_workdir(parser)


def run(args: argparse.Namespace) -> SuiteRun:
    rows = []
    with scratch(args.workdir, "bench-album-refresh-") as folder:
        for n in args.n:
            rows.append(refresh_cost(Path(folder) / f"col-{n}", n, args.new, args.albums, args.limit, args.dim,
                                     args.repeats))
    params = {"n": args.n, "new": args.new, "albums": args.albums, "limit": args.limit, "dim": args.dim,
              "rounds": args.repeats, "stored": "float32, flat index"}
    text = "\n".join(["| items | albums | make one album (s) | refresh of --new items (ms, median) | ms per new item |",
                      "|---:|---:|---:|---:|---:|",
                      *(f"| {r['n']:,} | {r['albums']} | {r['create_s']:.2f} | {r['refresh_ms']:.1f} | "
                        f"{r['ms_per_item']:.4f} |" for r in rows)])
    return SuiteRun(rows, params, "cpu", None, text=text)


def refresh_cost(root: Path, n: int, new: int, n_albums: int, limit: int, dim: int, rounds: int, seed: int = 0) -> dict:
    """Seconds to make the first album over `n` items (scoring all of them) and milliseconds of
    `refresh_albums` after each of `rounds` commits of `new` items (median, min, max)."""
    from faste_mm.bench.library import _synthetic
    from faste_mm.indexers import Collection, ItemRecord
    from faste_mm.indexers.albums import AlbumSpec
    from faste_mm.indexers.filters import SearchFilter
    from faste_mm.retrieval.library.albums import refresh_albums

    rng = np.random.default_rng(seed)

    def vectors(count: int) -> np.ndarray:
        x = rng.standard_normal((count, dim), dtype=np.float32)
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    def records(start: int, count: int) -> list[ItemRecord]:
        return [ItemRecord(uri=f"/bench/{'trip' if i % 4 == 0 else 'home'}/{i:07d}.{'jpg' if i % 3 else 'pdf'}",
                           modality="image" if i % 3 else "page", page=None if i % 3 else 1) for i in range(start, start + count)]

    create_s, times = [], []
    with Collection.create(root, _synthetic(dim).to_manifest("Flat")) as col:
        for start in range(0, n, 10_000):
            count = min(10_000, n - start)
            col.add(vectors(count), records(start, count))
        for a in range(n_albums):
            name, where = FILTERS[a % len(FILTERS)]
            spec = AlbumSpec(f"synthetic query {a}", None, SearchFilter(**where), limit)
            started = time.perf_counter()
            col.albums().create(f"{name}-{a}", spec, vectors(1)[0], col.vectors, None)
            create_s.append(time.perf_counter() - started)
        total = n
        for _ in range(rounds):
            col.add(vectors(new), records(total, new))
            total += new
            started = time.perf_counter()
            refresh_albums(col, None)
            times.append(time.perf_counter() - started)
    median = statistics.median(times)
    return {"n": n, "albums": n_albums, "new": new, "create_s": statistics.median(create_s),
            "refresh_ms": median * 1e3, "refresh_min_ms": min(times) * 1e3, "refresh_max_ms": max(times) * 1e3,
            "ms_per_item": median * 1e3 / new}

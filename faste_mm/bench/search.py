"""The search suite: one collection of random vectors -- build time, per-query and batched
latency, recall, memory (CPU FAISS, or GPU FAISS where the index type names it).

Builds a temporary collection of `n` random unit vectors with the requested index type
(default "auto") and measures it; random vectors are the hard case for approximate indexes.

    faste-mm bench search --n 10000 100000 --d 2048
"""

from __future__ import annotations

import argparse
import platform
import resource
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import faiss
import numpy as np

from faste_mm.indexers.collection import Collection
from faste_mm.indexers.faiss_index import INDEX_NAME
from faste_mm.indexers.manifest import Manifest
from faste_mm.indexers.records import ItemRecord
from faste_mm.bench.schema import SuiteRun

_ADD_BATCH = 8192


@dataclass(frozen=True, slots=True)
class SearchBenchmark:
    """Results of `search_benchmark`; times in seconds / milliseconds as named."""

    n: int
    d: int
    k: int
    n_queries: int
    index_factory: str
    add_s: float               # writing float16 parts + SQLite rows
    index_build_s: float       # training + adding to FAISS + saving index.faiss
    single_query_ms_median: float
    batched_query_ms_per_query: float
    recall_at_k: float         # overlap with exact top-k (near-ties on random data, see docs)
    planted_hit_at_1: float    # share of queries whose top-1 is the vector they were made from
    index_bytes: int
    vectors_bytes: int
    baseline_rss_bytes: int    # process peak RSS before building (interpreter + imports)
    peak_rss_bytes: int        # whole process, including generating the random vectors
    machine: str

    def to_dict(self) -> dict:
        return asdict(self)


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _unit(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    x = rng.standard_normal((n, d), dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _exact_top_k(col: Collection, n: int, queries: np.ndarray, k: int) -> np.ndarray:
    """Brute-force ids [q, k] over the stored (float16-rounded) vectors, in chunks."""
    best_s = np.full((len(queries), 0), -np.inf, dtype=np.float32)
    best_i = np.empty((len(queries), 0), dtype=np.int64)
    for start in range(0, n, _ADD_BATCH):
        ids = np.arange(start, min(n, start + _ADD_BATCH))
        s = queries @ col.vectors(ids).T
        best_s = np.concatenate([best_s, s], axis=1)
        best_i = np.concatenate([best_i, np.broadcast_to(ids, s.shape)], axis=1)
        top = np.argsort(-best_s, axis=1)[:, :k]
        best_s = np.take_along_axis(best_s, top, axis=1)
        best_i = np.take_along_axis(best_i, top, axis=1)
    return best_i


def search_benchmark(n: int, d: int = 2048, k: int = 10, n_queries: int = 100,
                     index_type: str = "auto", seed: int = 0) -> SearchBenchmark:
    """Build a temporary collection of `n` random unit vectors [n, d] and time searches.

    Queries are stored vectors plus noise (so each has a true near neighbour); recall@k compares
    the index's top-k with exact search. Example: search_benchmark(10_000).to_dict()
    """
    rng = np.random.default_rng(seed)
    baseline_rss = _peak_rss_bytes()
    with tempfile.TemporaryDirectory(prefix="faste-mm-bench-") as tmp:
        root = Path(tmp) / "bench.fmm"
        manifest = Manifest(model_id="bench/random", dim=d, index_type=index_type)
        with Collection.create(root, manifest) as col:
            t0 = time.perf_counter()
            for start in range(0, n, _ADD_BATCH):
                m = min(_ADD_BATCH, n - start)
                col.add(_unit(rng, m, d), [ItemRecord(uri=f"random:{start + i}", modality="text")
                                           for i in range(m)])
            add_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            factory = col.rebuild_index()
            build_s = time.perf_counter() - t0
            planted = rng.choice(n, size=n_queries, replace=False)  # ids are 0..n-1 here
            base = col.vectors(planted)
            queries = base + 0.5 * _unit(rng, n_queries, d)
            queries /= np.linalg.norm(queries, axis=1, keepdims=True)
            col.search(queries[:1], k)  # warm-up (page cache, thread pool)
            single = []
            for q in queries:
                t0 = time.perf_counter()
                col.search(q[None], k)
                single.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            _, found = col.search(queries, k)
            batched = (time.perf_counter() - t0) / n_queries
            exact = _exact_top_k(col, n, queries, k)
            recall = float(np.mean([len(set(a) & set(b)) / k for a, b in zip(found, exact)]))
            hit_at_1 = float(np.mean(found[:, 0] == planted))
            vectors_bytes = sum(p.stat().st_size for p in (root / "vectors").iterdir())
        index_bytes = (root / INDEX_NAME).stat().st_size
    return SearchBenchmark(
        n=n, d=d, k=k, n_queries=n_queries, index_factory=factory, add_s=round(add_s, 3),
        index_build_s=round(build_s, 3),
        single_query_ms_median=round(statistics.median(single) * 1e3, 3),
        batched_query_ms_per_query=round(batched * 1e3, 4), recall_at_k=round(recall, 4),
        planted_hit_at_1=round(hit_at_1, 4),
        index_bytes=index_bytes, vectors_bytes=vectors_bytes,
        baseline_rss_bytes=baseline_rss, peak_rss_bytes=_peak_rss_bytes(),
        machine=f"{platform.machine()}, {faiss.omp_get_max_threads()} FAISS threads, "
                f"faiss {faiss.__version__}, numpy {np.__version__}, {platform.platform()}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--n", type=int, nargs="+", required=True, help="collection sizes")
    parser.add_argument("--d", type=int, default=2048, help="vector width (default 2048)")
    parser.add_argument("--k", type=int, default=10, help="results per query (default 10)")
    parser.add_argument("--queries", type=int, default=100, help="queries timed (default 100)")
    parser.add_argument("--index-type", default="auto", help="'auto' or a FAISS factory string (default auto)")


def run(args: argparse.Namespace) -> SuiteRun:
    rows = [search_benchmark(n, args.d, args.k, args.queries, args.index_type).to_dict() for n in args.n]
    text = "\n".join(["| n | d | index | add s | build s | single query ms (median) | batched ms / query | recall@k | planted hit@1 | peak RSS MB |",
                      "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
                      *(f"| {r['n']:,} | {r['d']} | {r['index_factory']} | {r['add_s']} | {r['index_build_s']} | {r['single_query_ms_median']} | "
                        f"{r['batched_query_ms_per_query']} | {r['recall_at_k']} | {r['planted_hit_at_1']} | {r['peak_rss_bytes'] / 2**20:.0f} |" for r in rows)])
    params = {"d": args.d, "k": args.k, "queries": args.queries, "index_type": args.index_type, "machine": rows[0]["machine"]}
    return SuiteRun(rows, params, f"cpu ({faiss.omp_get_max_threads()} FAISS threads)", "float32", text=text)

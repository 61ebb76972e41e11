"""Measure faste-mm collections at scale: float, int8 + rescore, binary + rescore and `auto`, side by
side with raw FAISS (same factory string) and LanceDB (IVF_PQ, its recommended defaults), on the
same vectors in one process.

Vectors behave like embeddings, not uniform noise: a seeded mixture of clusters on the unit sphere
(each point a cluster centre plus Gaussian noise, re-normalised), with queries drawn near data
points. They are regenerated chunk by chunk from the seed, so the process never holds them all.
Everything is added through the Python API (`Collection.add`, 8192 rows a call) into real collections.

Reports per configuration: add throughput (vectors/s), index build time, peak RSS (sampled),
disk size, index size, query latency p50/p99 for single queries and batches of 32, recall@10
against exact search, and filtered search (1% of items match) p50 latency with the hit count.

Usage:
    python scripts/bench_scale.py --n 100000 --dim 2048 --queries 200 --out bench.json
    python scripts/bench_scale.py --n 1000000 --dim 512 --configs binary,int8 --no-lancedb
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from faste_mm.indexers import Collection, ItemRecord, Manifest, SearchFilter

CHUNK = 8192
K = 10
BATCH = 32
FILTER_BUCKETS = 100  # metadata "bucket" = i % 100; a filter on one bucket keeps 1% of items
CONFIGS = {
    # name: (Manifest settings, rescore factor or None for the default)
    "float": (dict(vectors="float32", keep="float", index_type="Flat"), None),
    "int8": (dict(vectors="int8", keep="float", index_type="SQ8"), None),
    "binary": (dict(vectors="binary", keep="float", index_type="BFlat"), None),
    "binary-keep-none": (dict(vectors="binary", keep="none", index_type="BFlat"), None),
    "auto": (dict(vectors="float32", keep="float", index_type="auto"), None),
    "auto-binary": (dict(vectors="binary", keep="float", index_type="auto"), None),
}


class Data:
    """The seeded mixture of clusters (see the module docstring)."""

    def __init__(self, n: int, dim: int, seed: int = 0, spread: float = 1.0) -> None:
        self.n, self.dim, self.seed, self.spread = n, dim, seed, spread
        rng = np.random.default_rng([seed, 0])
        self.n_centers = max(64, n // 200)
        c = rng.standard_normal((self.n_centers, dim)).astype(np.float32)
        self.centers = c / np.linalg.norm(c, axis=1, keepdims=True)

    def chunk(self, start: int, size: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, 1, start])
        labels = rng.integers(0, self.n_centers, size)
        x = self.centers[labels] + self.spread * rng.standard_normal((size, self.dim), dtype=np.float32) / np.sqrt(self.dim)
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    def chunks(self):
        for start in range(0, self.n, CHUNK):
            yield start, self.chunk(start, min(CHUNK, self.n - start))

    def queries(self, nq: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, 2])
        picks = np.sort(rng.choice(self.n, nq, replace=False))
        rows = []
        for start, x in self.chunks():
            sel = picks[(picks >= start) & (picks < start + len(x))] - start
            rows.append(x[sel])
        q = np.concatenate(rows) + 0.5 * rng.standard_normal((nq, self.dim), dtype=np.float32) / np.sqrt(self.dim)
        return q / np.linalg.norm(q, axis=1, keepdims=True)

    def exact(self, queries: np.ndarray, k: int, allowed_bucket: int | None = None) -> np.ndarray:
        best_s = np.full((len(queries), k), -np.inf, dtype=np.float32)
        best_i = np.full((len(queries), k), -1, dtype=np.int64)
        for start, x in self.chunks():
            ids = np.arange(start, start + len(x))
            s = queries @ x.T
            if allowed_bucket is not None:
                s[:, ids % FILTER_BUCKETS != allowed_bucket] = -np.inf
            s = np.concatenate([best_s, s], axis=1)
            i = np.concatenate([best_i, np.broadcast_to(ids, (len(queries), len(ids)))], axis=1)
            top = np.argsort(-s, axis=1)[:, :k]
            best_s, best_i = np.take_along_axis(s, top, axis=1), np.take_along_axis(i, top, axis=1)
        return best_i


class RssPeak:
    """Peak resident set size of this process (VmRSS sampled every 20 ms) between reset() calls."""

    def __init__(self) -> None:
        self.peak = 0
        threading.Thread(target=self._run, daemon=True).start()

    @staticmethod
    def now() -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    def _run(self) -> None:
        while True:
            self.peak = max(self.peak, self.now())
            time.sleep(0.02)

    def reset(self) -> None:
        self.peak = self.now()


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(f[f >= 0]) & set(t)) / len(t) for f, t in zip(found, truth)]))


def latencies(search, queries: np.ndarray) -> dict:
    """p50/p99 ms of single queries and of batches of 32, and the hits of all queries."""
    search(queries[:4])  # warm-up (index load, page cache)
    single, found = [], []
    for q in queries:
        t = time.perf_counter()
        found.append(search(q[None])[0])
        single.append(time.perf_counter() - t)
    batch = []
    for start in range(0, len(queries) - BATCH + 1, BATCH):
        t = time.perf_counter()
        search(queries[start:start + BATCH])
        batch.append(time.perf_counter() - t)
    ms = lambda xs, p: round(1000 * float(np.percentile(xs, p)), 2)  # noqa: E731
    return {"p50_ms": ms(single, 50), "p99_ms": ms(single, 99), "batch32_p50_ms": ms(batch, 50) if batch else None,
            "batch32_p99_ms": ms(batch, 99) if batch else None, "found": np.stack(found)}


def disk_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def bench_collection(name: str, data: Data, queries: np.ndarray, truth: np.ndarray, truth_filtered: np.ndarray,
                     workdir: Path, rss: RssPeak, rescore: int | None) -> dict:
    settings, default_rescore = CONFIGS[name]
    root = workdir / f"col-{name}"
    shutil.rmtree(root, ignore_errors=True)
    rss.reset()
    added = 0.0
    with Collection.create(root, Manifest(model_id="bench", dim=data.dim, memory_budget_bytes=4 * 2**30,
                                          **settings)) as col:
        for start, x in data.chunks():
            records = [ItemRecord(uri=f"/bench/{i}.jpg", modality="image", metadata={"bucket": i % FILTER_BUCKETS})
                       for i in range(start, start + len(x))]
            t = time.perf_counter()
            col.add(x, records)
            added += time.perf_counter() - t
        t = time.perf_counter()
        col.save_index()  # builds the index over every part
        build_s = time.perf_counter() - t
        factory = col.info().index_factory
    add_peak = rss.peak
    rss.reset()
    with Collection.open(root) as col:
        factor = rescore if rescore is not None else default_rescore
        timed = latencies(lambda q: col.search(q, K, rescore=factor)[1], queries)
        where = SearchFilter(where={"bucket": 0})
        filtered = latencies(lambda q: col.search(q, K, where=where, rescore=factor)[1], queries[:50])
        unrescored = recall(col.search(queries, K, rescore=0)[1], truth)
    result = {
        "config": name, "factory": factory, "n": data.n, "dim": data.dim, "add_vectors_per_s": round(data.n / added),
        "index_build_s": round(build_s, 1), "peak_rss_add_build_mb": round(add_peak / 2**20),
        "peak_rss_search_mb": round(rss.peak / 2**20), "disk_mb": round(disk_bytes(root) / 2**20),
        "index_mb": round((root / "index.faiss").stat().st_size / 2**20, 1),
        "recall_at_10": round(recall(timed.pop("found"), truth), 4), "recall_at_10_unrescored": round(unrescored, 4),
        **timed, "filtered_1pct_p50_ms": filtered["p50_ms"],
        "filtered_1pct_recall_at_10": round(recall(filtered["found"], truth_filtered[:50]), 4),
        "filtered_1pct_hits_min": int((filtered["found"] >= 0).sum(axis=1).min()),
    }
    shutil.rmtree(root, ignore_errors=True)
    return result


def bench_raw_faiss(factory: str, data: Data, queries: np.ndarray, truth: np.ndarray, rss: RssPeak) -> dict:
    """The same factory string in plain FAISS (no ids, no SQLite, no rescoring), default parameters
    of faste-mm's `search_parameters` so the two search the same structure."""
    import faiss

    from faste_mm.indexers import faiss_index

    rss.reset()
    binary = faiss_index.is_binary_factory(factory)
    index = faiss.index_binary_factory(data.dim, factory) if binary else \
        faiss.index_factory(data.dim, factory, faiss.METRIC_INNER_PRODUCT)
    t = time.perf_counter()
    prepare = (lambda x: np.packbits(x > 0, axis=1)) if binary else (lambda x: x)
    if not index.is_trained:
        index.train(prepare(data.chunk(0, min(data.n, 64 * 1024))))
    for _, x in data.chunks():
        index.add(prepare(x))
    build_s = time.perf_counter() - t
    params = faiss_index.search_parameters(index, K, None, None) if not binary else None
    timed = latencies(lambda q: index.search(prepare(q), K, params=params)[1], queries)
    return {"config": f"raw-faiss {factory}", "factory": factory, "n": data.n, "dim": data.dim,
            "index_build_s": round(build_s, 1), "peak_rss_add_build_mb": round(rss.peak / 2**20),
            "recall_at_10": round(recall(timed.pop("found"), truth), 4), **timed}


def bench_lancedb(data: Data, queries: np.ndarray, truth: np.ndarray, workdir: Path, rss: RssPeak) -> dict:
    """LanceDB embedded: a table of the float32 vectors, IVF_PQ with its defaults, default search."""
    import lancedb
    import pyarrow as pa
    from lancedb.index import IvfPq

    rss.reset()
    path = workdir / "lancedb"
    shutil.rmtree(path, ignore_errors=True)
    db = lancedb.connect(str(path))
    schema = pa.schema([("id", pa.int64()), ("bucket", pa.int64()), ("vector", pa.list_(pa.float32(), data.dim))])
    table = db.create_table("bench", schema=schema, mode="overwrite")
    t = time.perf_counter()
    for start, x in data.chunks():
        ids = np.arange(start, start + len(x))
        table.add(pa.table({"id": ids, "bucket": ids % FILTER_BUCKETS,
                            "vector": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), data.dim)}, schema=schema))
    add_s = time.perf_counter() - t
    t = time.perf_counter()
    table.create_index("vector", config=IvfPq(distance_type="dot"))
    build_s = time.perf_counter() - t

    def search(q: np.ndarray) -> np.ndarray:
        out = np.full((len(q), K), -1, dtype=np.int64)
        for row, v in enumerate(q):
            hits = table.search(v).distance_type("dot").limit(K).select(["id"]).to_arrow()["id"].to_numpy()
            out[row, :len(hits)] = hits
        return out

    timed = latencies(search, queries)
    filtered = latencies(lambda q: np.stack([table.search(v).distance_type("dot").where("bucket = 0", prefilter=True)
                                             .limit(K).select(["id"]).to_arrow()["id"].to_numpy() for v in q]),
                         queries[:50])
    result = {"config": "lancedb IVF_PQ (defaults)", "n": data.n, "dim": data.dim,
              "add_vectors_per_s": round(data.n / add_s), "index_build_s": round(build_s, 1),
              "peak_rss_add_build_mb": round(rss.peak / 2**20), "disk_mb": round(disk_bytes(path) / 2**20),
              "recall_at_10": round(recall(timed.pop("found"), truth), 4), **timed,
              "filtered_1pct_p50_ms": filtered["p50_ms"]}
    shutil.rmtree(path, ignore_errors=True)
    return result


COLUMNS = [("config", "configuration"), ("factory", "index"), ("recall_at_10", "recall@10"),
           ("recall_at_10_unrescored", "recall@10 unrescored"), ("p50_ms", "p50 ms"), ("p99_ms", "p99 ms"),
           ("batch32_p50_ms", "batch-32 p50 ms"), ("filtered_1pct_p50_ms", "1% filter p50 ms"),
           ("add_vectors_per_s", "add vec/s"), ("index_build_s", "build s"), ("index_mb", "index MB"),
           ("disk_mb", "disk MB"), ("peak_rss_add_build_mb", "peak RSS MB (add+build)")]


def markdown(path: Path) -> str:
    """The results of `--out` FILE as a Markdown table (one row per configuration)."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    out = ["| " + " | ".join(title for _, title in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        out.append("| " + " | ".join("" if r.get(key) is None else str(r[key]) for key, _ in COLUMNS) + " |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=2048)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--configs", default="float,int8,binary,binary-keep-none,auto",
                        help=f"comma-separated, of {', '.join(CONFIGS)}")
    parser.add_argument("--rescore", type=int, default=None, help="candidates per hit (default: the precision's)")
    parser.add_argument("--raw-faiss", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--lancedb", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--threads", type=int, default=1,
                        help="FAISS OpenMP threads for every contender (default 1: on a shared, loaded machine an "
                             "OpenMP barrier waiting for a descheduled thread costs ~70 ms a search)")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None, help="append results as JSON lines")
    parser.add_argument("--table", type=Path, default=None, help="print the results in FILE (--out) as Markdown and exit")
    args = parser.parse_args()
    if args.table:
        print(markdown(args.table))
        return
    import faiss

    faiss.omp_set_num_threads(args.threads)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-scale-"))
    data = Data(args.n, args.dim)
    rss = RssPeak()
    queries = data.queries(args.queries)
    t = time.perf_counter()
    truth = data.exact(queries, K)
    truth_filtered = data.exact(queries[:50], K, allowed_bucket=0)
    print(f"# {args.n} x {args.dim}, {args.queries} queries; exact truth in {time.perf_counter() - t:.1f} s; "
          f"{os.cpu_count()} CPUs, {args.threads} FAISS threads", file=sys.stderr, flush=True)

    def emit(result: dict) -> None:
        line = json.dumps(result)
        print(line, flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(line + "\n")

    factories = set()
    for name in args.configs.split(","):
        result = bench_collection(name, data, queries, truth, truth_filtered, workdir, rss, args.rescore)
        factories.add(result["factory"])
        emit(result)
    if args.raw_faiss:
        for factory in sorted(factories):
            emit(bench_raw_faiss(factory, data, queries, truth, rss))
    if args.lancedb:
        emit(bench_lancedb(data, queries, truth, workdir, rss))


if __name__ == "__main__":
    main()

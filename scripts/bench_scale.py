"""Measure faste-mm collections at scale: float, int8 + rescore, binary + rescore and `auto`, side by
side with raw FAISS (the collection's own index, its IndexIDMap2 unwrapped: same factory string, same
bytes in RAM) and LanceDB (IVF_PQ with its defaults; default search and refine_factor 10), on the
same vectors in one process.

Vectors behave like embeddings, not uniform noise: a seeded mixture of clusters on the unit sphere
(each point a cluster centre plus Gaussian noise, re-normalised), with queries drawn near data
points; each item also gets a 12-word text (Zipf-like vocabulary) for the lexical index. They are
regenerated chunk by chunk from the seed, so the process never holds them all. Everything is added
through the Python API (`Collection.add`, 8192 rows a call, every chunk to every collection in turn)
into real collections. The exact truth is computed in one pass and cached in the work directory.

Searches are interleaved: each query is answered by every contender in turn (the starting contender
rotates), so a shared machine's changing load falls on all of them alike; read ratios within one
run. Reports per contender: add throughput (vectors/s), index build time, RSS growth while
building, disk and index size, query latency p50/p99 for single queries and batches of 32,
recall@10 against exact search, filtered search (1% of items match: p50, min hits, recall) and
lexical/hybrid p50/p99.

Usage:
    python scripts/bench_scale.py --n 100000 --dim 2048 --queries 200 --out bench.jsonl
    python scripts/bench_scale.py --n 1000000 --dim 2048 --configs binary --no-lancedb --timed-queries 40 \
        --workdir /big/disk/bench --keep-workdir --out bench.jsonl   # then --reuse to search again
    python scripts/bench_scale.py --table bench.jsonl
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("LANCE_LOG", "error")  # LanceDB's deprecation notice, once per search, drowns the log
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import faiss
import numpy as np

try:
    from threadpoolctl import threadpool_limits
except ImportError:  # then numpy's BLAS keeps its own thread count
    threadpool_limits = None

from faste_mm.indexers import Collection, ItemRecord, Manifest, SearchFilter, collection_search

CHUNK = 8192
K = 10
FILTER_BLOCKS = 4  # --interleave config: filtered and unfiltered searches alternate in this many blocks
BATCH = 32
WORDS_PER_ITEM = 12
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

    def picks(self, nq: int) -> np.ndarray:
        """The data rows the queries are drawn near, ascending."""
        return np.sort(np.random.default_rng([self.seed, 2]).choice(self.n, nq, replace=False))

    def queries(self, nq: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, 2])
        picks = np.sort(rng.choice(self.n, nq, replace=False))
        rows = []
        for start, x in self.chunks():
            sel = picks[(picks >= start) & (picks < start + len(x))] - start
            rows.append(x[sel])
        q = np.concatenate(rows) + 0.5 * rng.standard_normal((nq, self.dim), dtype=np.float32) / np.sqrt(self.dim)
        return q / np.linalg.norm(q, axis=1, keepdims=True)

    def exact(self, queries: np.ndarray, k: int, filtered: int) -> tuple[np.ndarray, np.ndarray]:
        """Exact top-k ids of every query, and of the first `filtered` queries over the items of
        bucket 0 only (the 1% filter): one pass over the data."""
        best = [(np.full((len(queries), 0), -np.inf, np.float32), np.zeros((len(queries), 0), np.int64)),
                (np.full((filtered, 0), -np.inf, np.float32), np.zeros((filtered, 0), np.int64))]
        for start, x in self.chunks():
            ids = np.arange(start, start + len(x))
            s = queries @ x.T
            for which, (scores, cols) in enumerate([(s, ids), (s[:filtered, ids % FILTER_BUCKETS == 0],
                                                              ids[ids % FILTER_BUCKETS == 0])]):
                s2 = np.concatenate([best[which][0], scores], axis=1)
                i2 = np.concatenate([best[which][1], np.broadcast_to(cols, (len(scores), len(cols)))], axis=1)
                top = np.argsort(-s2, axis=1)[:, :k]
                best[which] = (np.take_along_axis(s2, top, axis=1), np.take_along_axis(i2, top, axis=1))
        return best[0][1], best[1][1]


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


def disk_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


class Words:
    """Seeded item texts: WORDS_PER_ITEM words drawn from a Zipf-like vocabulary (p ~ 1/rank), as
    the body of each item's lexical row; a query's text is two of its source item's words."""

    def __init__(self, seed: int = 0, vocabulary: int = 30_000) -> None:
        syllables = [a + b for a in "bdfgklmnprstvz" for b in "aeiou"]  # 70
        rng = np.random.default_rng([seed, 3])
        self.vocab = np.array(sorted({"".join(rng.choice(syllables, 3)) for _ in range(3 * vocabulary)})[:vocabulary])
        rng.shuffle(self.vocab)
        p = 1.0 / np.arange(1, len(self.vocab) + 1)
        self.cdf = np.cumsum(p / p.sum())
        self.seed = seed

    def words(self, start: int, size: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, 4, start])
        return np.minimum(np.searchsorted(self.cdf, rng.random((size, WORDS_PER_ITEM))), len(self.vocab) - 1)

    def texts(self, start: int, size: int) -> list[str]:
        return [" ".join(self.vocab[row]) for row in self.words(start, size)]

    def query(self, item: int, which: int) -> str:
        start = item - item % CHUNK
        row = self.words(start, CHUNK)[item - start]
        pick = np.random.default_rng([self.seed, 5, which]).choice(WORDS_PER_ITEM, 2, replace=False)
        return " ".join(self.vocab[row[pick]])


class Timer:
    """Per-contender latencies, gathered interleaved (each round runs every contender once, in an
    order rotated per round, so the machine's load drifts over all of them alike)."""

    def __init__(self) -> None:
        self.times: dict[str, list[float]] = {}
        self.found: dict[str, list[np.ndarray]] = {}

    def rounds(self, contenders: dict, inputs: list, keep_found: bool = True) -> None:
        names = list(contenders)
        for r, x in enumerate(inputs):
            for name in names[r % len(names):] + names[:r % len(names)]:
                t = time.perf_counter()
                ids = contenders[name](x)
                self.times.setdefault(name, []).append(time.perf_counter() - t)
                if keep_found:
                    self.found.setdefault(name, []).append(ids)

    def ms(self, name: str, p: float) -> float | None:
        xs = self.times.get(name)
        return round(1000 * float(np.percentile(xs, p)), 2) if xs else None

    def hits(self, name: str) -> np.ndarray:
        return np.concatenate(self.found[name])


def records_for(start: int, size: int, texts: list[str] | None) -> list[ItemRecord]:
    return [ItemRecord(uri=f"/bench/{i}.jpg", modality="image", metadata={"bucket": i % FILTER_BUCKETS},
                       text=texts[i - start] if texts else None) for i in range(start, start + size)]


def lancedb_table(path: Path, dim: int, create: bool = True):
    import lancedb
    import pyarrow as pa

    schema = pa.schema([("id", pa.int64()), ("bucket", pa.int64()), ("vector", pa.list_(pa.float32(), dim))])
    if not create:
        return lancedb.connect(str(path)).open_table("bench"), schema
    shutil.rmtree(path, ignore_errors=True)
    return lancedb.connect(str(path)).create_table("bench", schema=schema, mode="overwrite"), schema


def lancedb_add(table, schema, start: int, x: np.ndarray) -> None:
    import pyarrow as pa

    ids = np.arange(start, start + len(x))
    table.add(pa.table({"id": ids, "bucket": ids % FILTER_BUCKETS,
                        "vector": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), x.shape[1])}, schema=schema))


def lancedb_search(table, where: str | None = None, refine: int | None = None):
    """LanceDB's default query (nprobes left to it; `refine`: its refine_factor, re-ranking
    refine x K candidates by their full vectors, what its docs advise for recall): ids [q, K]."""
    def run(q: np.ndarray) -> np.ndarray:
        out = np.full((len(q), K), -1, dtype=np.int64)
        for row, v in enumerate(q):
            query = table.search(v).distance_type("dot")
            if refine:
                query = query.refine_factor(refine)
            if where:
                query = query.where(where, prefilter=True)
            hits = query.limit(K).select(["id"]).to_arrow()["id"].to_numpy()
            out[row, :len(hits)] = hits
        return out
    return run


def raw_faiss(col: Collection):
    """The collection's own FAISS index without faste-mm around it: the index its factory string
    made (the `IndexIDMap2` unwrapped, so its ids are insertion positions = data rows), searched
    with the same per-call parameters. The same object in RAM: no second copy of an 8 GB index."""
    from faste_mm.indexers import faiss_index
    from faste_mm.indexers.quantization import encode_binary

    col.search(np.zeros((1, col.manifest.dim), dtype=np.float32), K, rescore=0)  # loads index.faiss
    wrapped = col._index.index
    binary = faiss_index.is_binary(wrapped)
    inner = faiss.downcast_IndexBinary(wrapped.index) if binary else faiss.downcast_index(wrapped.index)
    params = faiss_index.search_parameters(inner, K, None, None)
    if binary:
        return lambda q: inner.search(encode_binary(q), K, params=params)[1]
    return lambda q: inner.search(np.ascontiguousarray(q), K, params=params)[1]


def contender_groups(contenders: dict, interleave: str) -> list[dict]:
    """The contenders timed together, interleaved query by query: "all", every one of them (each
    search then follows other configurations' searches, e.g. a Flat index's 800 MB scan, which
    evict the CPU caches: a fixed cost of ~0.25 ms shows); "config", each configuration with its own
    `rescore 0` and `raw-faiss` rows, one configuration after another (searches back to back on one
    collection, as a server answers them)."""
    if interleave == "all":
        return [contenders]
    groups: dict[str, dict] = {}
    for name, run in contenders.items():
        base = name[len("raw-faiss "):] if name.startswith("raw-faiss ") else name.split(" ")[0]
        groups.setdefault(base, {})[name] = run
    return list(groups.values())


def build_all(args, data: Data, words: Words, names: list[str], results: dict, workdir: Path,
              rss: RssPeak) -> tuple[dict, dict | None, int]:
    """Add every chunk to every collection (and LanceDB), then build each index: the add and
    build columns of the results, the LanceDB row, the peak RSS while adding."""
    # ---- add: every chunk to every contender in turn (the load drifts over all alike)
    cols = {}
    for name in names:
        root = workdir / f"col-{name}"
        shutil.rmtree(root, ignore_errors=True)
        cols[name] = Collection.create(root, Manifest(model_id="bench", dim=data.dim, memory_budget_bytes=args.budget_gib * 2**30,
                                                      **CONFIGS[name][0]))
    lance = lancedb_table(workdir / "lancedb", data.dim) if args.lancedb else None
    added = dict.fromkeys(names + ["lancedb"], 0.0)
    rss.reset()
    for start, x in data.chunks():
        texts = words.texts(start, len(x)) if args.text else None
        for name, col in cols.items():
            records = records_for(start, len(x), texts)  # building the records is the caller's cost, not add's
            t = time.perf_counter()
            col.add(x, records)
            added[name] += time.perf_counter() - t
        if lance:
            t = time.perf_counter()
            lancedb_add(*lance, start, x)
            added["lancedb"] += time.perf_counter() - t
        if start % (16 * CHUNK) == 0:
            log(f"  added {start + len(x)} ({time.strftime('%H:%M:%S')}, rss {RssPeak.now() / 2**30:.1f} GiB)")
    for name in names:
        results[name]["add_vectors_per_s"] = round(data.n / added[name])
    results_add_peak = rss.peak
    # ---- build: one index at a time, each collection closed after (its index is freed)
    faiss.omp_set_num_threads(args.build_threads)
    for name in names:
        rss.reset()
        before = RssPeak.now()
        t = time.perf_counter()
        cols[name].save_index()
        results[name]["index_build_s"] = round(time.perf_counter() - t, 1)
        results[name]["factory"] = cols[name].info().index_factory
        cols[name].close()
        root = workdir / f"col-{name}"
        results[name]["peak_rss_build_mb"] = round((rss.peak - before) / 2**20)
        results[name]["index_mb"] = round((root / "index.faiss").stat().st_size / 2**20, 1)
        results[name]["disk_mb"] = round(disk_bytes(root) / 2**20)
        log(f"  built {name}: {results[name]['factory']} in {results[name]['index_build_s']} s")
    lance_result = None
    if lance:
        from lancedb.index import IvfPq

        rss.reset()
        before = RssPeak.now()
        t = time.perf_counter()
        lance[0].create_index("vector", config=IvfPq(distance_type="dot"))
        lance_result = {"config": "lancedb IVF_PQ (defaults)", "factory": "IVF_PQ", "n": data.n, "dim": data.dim,
                        "add_vectors_per_s": round(data.n / added["lancedb"]),
                        "index_build_s": round(time.perf_counter() - t, 1),
                        "peak_rss_build_mb": round((rss.peak - before) / 2**20),
                        "disk_mb": round(disk_bytes(workdir / "lancedb") / 2**20)}
        log(f"  built lancedb IVF_PQ in {lance_result['index_build_s']} s")
    return results, lance_result, results_add_peak


def run(args) -> list[dict]:
    faiss.omp_set_num_threads(args.threads)
    if threadpool_limits is not None:  # numpy's BLAS (rescoring, exact filtered search) like FAISS
        threadpool_limits(args.threads, user_api="blas")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-scale-"))
    workdir.mkdir(parents=True, exist_ok=True)
    data, words = Data(args.n, args.dim), Words()
    rss = RssPeak()
    picks = data.picks(args.queries)
    cached = workdir / f"truth-{args.n}x{args.dim}-{args.queries}-{args.filtered_queries}.npz"
    t = time.perf_counter()
    if cached.exists():
        saved = np.load(cached)
        queries, truth, truth_filtered = saved["queries"], saved["truth"], saved["truth_filtered"]
    else:
        queries = data.queries(args.queries)
        truth, truth_filtered = data.exact(queries, K, args.filtered_queries)
        np.savez(cached, queries=queries, truth=truth, truth_filtered=truth_filtered)
    log(f"# {args.n} x {args.dim}, {args.queries} queries; exact truth in {time.perf_counter() - t:.1f} s; "
        f"{os.cpu_count()} CPUs, {args.threads} FAISS/BLAS threads for search, {args.build_threads} for builds")
    names = [name for name in args.configs.split(",") if name not in ("", "none")]  # "none": LanceDB alone
    results = {name: {"config": name, "n": data.n, "dim": data.dim} for name in names}

    built = workdir / f"built-{args.n}x{args.dim}-{args.configs}-{int(args.lancedb)}.json"
    if args.reuse and built.exists():
        results, lance_result, results_add_peak = json.loads(built.read_text())
        log(f"  reusing the collections built in {workdir}")
    else:
        results, lance_result, results_add_peak = build_all(args, data, words, names, results, workdir, rss)
        built.write_text(json.dumps([results, lance_result, results_add_peak]))
    lance = lancedb_table(workdir / "lancedb", data.dim, create=False) if args.lancedb else None
    faiss.omp_set_num_threads(args.threads)

    # ---- search: every contender per query, interleaved
    rss.reset()
    before = RssPeak.now()
    cols = {name: Collection.open(workdir / f"col-{name}") for name in names}
    single, batched, filtered, texts = {}, {}, {}, {}
    where = SearchFilter(where={"bucket": 0})
    for name, col in cols.items():
        single[name] = lambda q, col=col: col.search(q, K)[1]
        col.search(queries[:1], K)  # loads the index, whose factory says whether it rescores
        quantized = collection_search.rescores(col._index.factory, col.manifest.stored_precision)
        if quantized:
            single[f"{name} rescore 0"] = lambda q, col=col: col.search(q, K, rescore=0)[1]
        if args.raw_faiss:
            single[f"raw-faiss {name}"] = raw_faiss(col)
        filtered[name] = lambda q, col=col: col.search(q, K, where=where)[1]
        # The first search with a filter, or the first after any commit: nothing remembered (`remembered`).
        filtered[f"{name} uncached"] = lambda q, col=col: (col._store._remembered.forget(), col.search(q, K, where=where))[1][1]
        if args.text:
            texts[f"{name} lexical"] = lambda a, col=col: col.find(K, texts=a[1], mode="lexical").ids
            texts[f"{name} hybrid"] = lambda a, col=col: col.find(K, queries=a[0], texts=a[1], mode="hybrid").ids
    if lance:
        single["lancedb"] = lancedb_search(lance[0])
        single["lancedb refine 10"] = lancedb_search(lance[0], refine=10)
        filtered["lancedb"] = lancedb_search(lance[0], "bucket = 0")
    warm = Timer()
    warm.rounds(single, [queries[i:i + 1] for i in range(min(4, len(queries)))], keep_found=False)
    log(f"  searching ({time.strftime('%H:%M:%S')})")
    one = Timer()
    timed = min(args.timed_queries or len(queries), len(queries))
    batch = Timer()
    starts = list(range(0, len(queries) - BATCH + 1, BATCH))[:args.batches]
    for group in contender_groups(single, args.interleave):
        one.rounds(group, [queries[i:i + 1] for i in range(timed)])
    log(f"  single done ({time.strftime('%H:%M:%S')})")
    for group in contender_groups(single, args.interleave):
        batch.rounds(group, [queries[s:s + BATCH] for s in starts], keep_found=False)
    log(f"  batches done ({time.strftime('%H:%M:%S')})")
    filt = Timer()
    n_filtered = min(args.timed_filtered or args.filtered_queries, args.filtered_queries)
    inputs = [queries[i:i + 1] for i in range(n_filtered)]
    if args.interleave == "all":  # every filtered contender interleaved, as before
        filt.rounds(filtered, inputs)
    else:  # "config": each contender alone, back to back as a server answers (the uncached row forgets
        # each time), in blocks alternating with the same collection's unfiltered search, timed as
        # `NAME unfiltered`: the ratio's two sides are measured in the same minutes (a shared host's
        # speed drifts 2x between a run's phases)
        for block in np.array_split(np.arange(n_filtered), FILTER_BLOCKS):
            for name, run_filtered in filtered.items():
                base = name.split(" ")[0]
                group = {name: run_filtered} if name.endswith(" uncached") or base not in single else {
                    f"{base} unfiltered": single[base], name: run_filtered}
                for contender, run_one in group.items():
                    filt.rounds({contender: run_one}, [inputs[i] for i in block])
    lex = Timer()
    if texts:
        query_texts = [words.query(int(picks[i]), i) for i in range(n_filtered)]
        lex.rounds(texts, [(queries[i:i + 1], [query_texts[i]]) for i in range(n_filtered)], keep_found=False)
    search_peak = rss.peak - before

    rows = []
    for name in single:
        if name in results:
            row = dict(results[name], peak_rss_add_mb=round(results_add_peak / 2**20) if results_add_peak else None)
        elif name.startswith("lancedb"):
            row = dict(lance_result, config=name.replace("lancedb", lance_result["config"]))
        else:  # "NAME rescore 0" or "raw-faiss NAME": the same index as NAME's
            config = name.split(" ")[-1] if name.startswith("raw-faiss") else name.split(" ")[0]
            row = {"config": name, "factory": results[config]["factory"], "n": data.n, "dim": data.dim}
        found = one.hits(name)  # a new collection's ids are its rows' positions (0, 1, ...)
        row["interleave"] = args.interleave
        row.update({"recall_at_10": round(recall(found, truth[:timed]), 4), "p50_ms": one.ms(name, 50), "p99_ms": one.ms(name, 99),
                    "batch32_p50_ms": batch.ms(name, 50), "batch32_p99_ms": batch.ms(name, 99)})
        if name in filtered:
            hits = filt.hits(name)
            row.update({"filtered_1pct_p50_ms": filt.ms(name, 50),
                        "filtered_1pct_recall_at_10": round(recall(hits, truth_filtered[:n_filtered]), 4),
                        "filtered_1pct_hits_min": int((hits >= 0).sum(axis=1).min())})
        if f"{name} unfiltered" in filt.times:  # --interleave config: the unfiltered side of the filter's ratio
            row["filter_phase_unfiltered_p50_ms"] = filt.ms(f"{name} unfiltered", 50)
        if f"{name} uncached" in filtered:
            row["filtered_1pct_uncached_p50_ms"] = filt.ms(f"{name} uncached", 50)
        if f"{name} hybrid" in texts:
            row.update({"lexical_p50_ms": lex.ms(f"{name} lexical", 50), "lexical_p99_ms": lex.ms(f"{name} lexical", 99),
                        "hybrid_p50_ms": lex.ms(f"{name} hybrid", 50), "hybrid_p99_ms": lex.ms(f"{name} hybrid", 99)})
        rows.append(row)
    log(f"  search-phase RSS growth {search_peak / 2**20:.0f} MB (every index open at once)")
    for col in cols.values():
        col.close()
    if not args.keep_workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return rows


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


COLUMNS = [("config", "configuration"), ("factory", "index"), ("interleave", "interleaved"), ("recall_at_10", "recall@10"),
           ("p50_ms", "p50 ms"), ("p50_ms_x_raw", "p50 x raw FAISS"), ("p99_ms", "p99 ms"),
           ("batch32_p50_ms", "batch-32 p50 ms"), ("batch32_p50_ms_x_raw", "batch-32 x raw FAISS"),
           ("batch32_p99_ms", "batch-32 p99 ms"), ("filtered_1pct_p50_ms", "1% filter p50 ms"),
           ("filter_phase_unfiltered_p50_ms", "unfiltered p50 ms beside it"), ("filtered_x_unfiltered", "1% filter x unfiltered"),
           ("filtered_1pct_uncached_p50_ms", "1% filter p50 ms, uncached"), ("filtered_1pct_hits_min", "1% filter min hits"), ("filtered_1pct_recall_at_10", "1% filter recall@10"),
           ("lexical_p50_ms", "lexical p50 ms"), ("hybrid_p50_ms", "hybrid p50 ms"), ("hybrid_p99_ms", "hybrid p99 ms"),
           ("add_vectors_per_s", "add vec/s"), ("index_build_s", "build s"), ("index_mb", "index MB"),
           ("disk_mb", "disk MB"), ("peak_rss_build_mb", "RSS growth in build MB")]


def with_ratios(rows: list[dict]) -> list[dict]:
    """Rows plus the ratios read from them: faste-mm's latency over raw FAISS's at equal recall (a
    quantized NAME's `NAME rescore 0` row, or NAME itself where nothing rescores, against `raw-faiss
    NAME` of the same size), and the 1% filter's p50 over the unfiltered default search's."""
    raw = {(r["n"], r["dim"], r["config"][len("raw-faiss "):]): r for r in rows if r["config"].startswith("raw-faiss ")}
    rescored = {(r["n"], r["dim"], r["config"].split(" ")[0]) for r in rows if r["config"].endswith(" rescore 0")}
    out = []
    for r in rows:
        r = dict(r)
        name = r["config"].split(" ")[0]
        base = raw.get((r["n"], r["dim"], name))
        same_recall = r["config"].endswith(" rescore 0") or (r["config"] == name and (r["n"], r["dim"], name) not in rescored)
        if base and same_recall:
            for key in ("p50_ms", "batch32_p50_ms"):
                if r.get(key) and base.get(key):
                    r[f"{key}_x_raw"] = round(r[key] / base[key], 2)
        unfiltered = r.get("filter_phase_unfiltered_p50_ms") or r.get("p50_ms")  # measured beside it, where it was
        if r.get("filtered_1pct_p50_ms") and unfiltered:
            r["filtered_x_unfiltered"] = round(r["filtered_1pct_p50_ms"] / unfiltered, 2)
        out.append(r)
    return out


def markdown(path: Path) -> str:
    """The results of `--out` FILE as a Markdown table (one row per configuration)."""
    rows = with_ratios([json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()])
    columns = [c for c in COLUMNS if any(r.get(c[0]) is not None for r in rows)]  # no empty columns
    out = ["| " + " | ".join(title for _, title in columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        out.append("| " + " | ".join("" if r.get(key) is None else str(r[key]) for key, _ in columns) + " |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=2048)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--timed-queries", type=int, default=None,
                        help="single-query rounds over the first N queries only (default all; batches use all)")
    parser.add_argument("--batches", type=int, default=None, help="batch-of-32 rounds (default: all the queries hold)")
    parser.add_argument("--timed-filtered", type=int, default=None,
                        help="filtered and text rounds over the first N of --filtered-queries only")
    parser.add_argument("--filtered-queries", type=int, default=50, help="queries for the filter and text rows")
    parser.add_argument("--configs", default="float,int8,binary,auto",
                        help=f"comma-separated, of {', '.join(CONFIGS)}; none: LanceDB alone")
    parser.add_argument("--budget-gib", type=int, default=4, help="the collections' memory budget (auto's choice)")
    parser.add_argument("--raw-faiss", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--lancedb", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--text", action=argparse.BooleanOptionalAction, default=True,
                        help="give every item a text (lexical and hybrid rows)")
    parser.add_argument("--threads", type=int, default=1,
                        help="FAISS OpenMP threads for searches (default 1: on a shared, loaded machine an "
                             "OpenMP barrier waiting for a descheduled thread costs ~70 ms a search)")
    parser.add_argument("--build-threads", type=int, default=2, help="FAISS OpenMP threads for index builds")
    parser.add_argument("--interleave", choices=("all", "config"), default="all",
                        help="time single queries and batches with every contender interleaved (all), or each "
                             "configuration with its own rescore-0 and raw-FAISS rows, one configuration after "
                             "another (config: back to back on one collection, as a server searches)")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--keep-workdir", action="store_true", help="keep the collections (for --reuse)")
    parser.add_argument("--reuse", action="store_true",
                        help="search the collections a --keep-workdir run of the same sizes left in --workdir")
    parser.add_argument("--out", type=Path, default=None, help="append results as JSON lines")
    parser.add_argument("--table", type=Path, default=None, help="print the results in FILE (--out) as Markdown and exit")
    args = parser.parse_args()
    if args.table:
        print(markdown(args.table))
        return
    for row in run(args):
        line = json.dumps(row)
        print(line, flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(line + "\n")


if __name__ == "__main__":
    main()

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
    faste-mm bench scale --n 100000 --dim 2048 --queries 200 --out scale.json
    faste-mm bench scale --n 1000000 --dim 2048 --configs binary --no-lancedb --timed-queries 40 \
        --workdir /big/disk/bench --keep-workdir --out scale.json   # then --reuse to search again
"""

from __future__ import annotations

import argparse
import json
import logging
import os

os.environ.setdefault("LANCE_LOG", "error")  # LanceDB's deprecation notice, once per search, drowns the log
import shutil
import tempfile
import time
from pathlib import Path

import faiss
import numpy as np

try:
    from threadpoolctl import threadpool_limits
except ImportError:  # then numpy's BLAS keeps its own thread count
    threadpool_limits = None

from faste_mm.bench.scale_data import (BATCH, CHUNK, CONFIGS, FILTER_BLOCKS, K, Data, RssPeak, Timer, Words, contender_groups,
                                       disk_bytes, lancedb_add, lancedb_search, lancedb_table, raw_faiss, recall, records_for)
from faste_mm.bench.schema import SuiteRun
from faste_mm.indexers import Collection, Manifest, SearchFilter, collection_search

log = logging.getLogger(__name__)

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
            log.info(f"  added {start + len(x)} ({time.strftime('%H:%M:%S')}, rss {RssPeak.now() / 2**30:.1f} GiB)")
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
        log.info(f"  built {name}: {results[name]['factory']} in {results[name]['index_build_s']} s")
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
        log.info(f"  built lancedb IVF_PQ in {lance_result['index_build_s']} s")
    return results, lance_result, results_add_peak


def measure(args) -> list[dict]:
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
    log.info(f"# {args.n} x {args.dim}, {args.queries} queries; exact truth in {time.perf_counter() - t:.1f} s; "
        f"{os.cpu_count()} CPUs, {args.threads} FAISS/BLAS threads for search, {args.build_threads} for builds")
    names = [name for name in args.configs.split(",") if name not in ("", "none")]  # "none": LanceDB alone
    results = {name: {"config": name, "n": data.n, "dim": data.dim} for name in names}

    built = workdir / f"built-{args.n}x{args.dim}-{args.configs}-{int(args.lancedb)}.json"
    if args.reuse and built.exists():
        results, lance_result, results_add_peak = json.loads(built.read_text())
        log.info(f"  reusing the collections built in {workdir}")
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
    log.info(f"  searching ({time.strftime('%H:%M:%S')})")
    one = Timer()
    timed = min(args.timed_queries or len(queries), len(queries))
    batch = Timer()
    starts = list(range(0, len(queries) - BATCH + 1, BATCH))[:args.batches]
    for group in contender_groups(single, args.interleave):
        one.rounds(group, [queries[i:i + 1] for i in range(timed)])
    log.info(f"  single done ({time.strftime('%H:%M:%S')})")
    for group in contender_groups(single, args.interleave):
        batch.rounds(group, [queries[s:s + BATCH] for s in starts], keep_found=False)
    log.info(f"  batches done ({time.strftime('%H:%M:%S')})")
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
    log.info(f"  search-phase RSS growth {search_peak / 2**20:.0f} MB (every index open at once)")
    for col in cols.values():
        col.close()
    if not args.keep_workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return rows


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


def markdown(rows: list[dict]) -> str:
    """Result rows (with their ratios) as a Markdown table (one row per configuration)."""
    columns = [c for c in COLUMNS if any(r.get(c[0]) is not None for r in rows)]  # no empty columns
    out = ["| " + " | ".join(title for _, title in columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        out.append("| " + " | ".join("" if r.get(key) is None else str(r[key]) for key, _ in columns) + " |")
    return "\n".join(out)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--n", type=int, default=100_000, help="items (default 100,000)")
    parser.add_argument("--dim", type=int, default=2048, help="vector width (default 2048)")
    parser.add_argument("--queries", type=int, default=200, help="queries (default 200)")
    parser.add_argument("--timed-queries", type=int, default=None,
                        help="single-query rounds over the first N queries only (default all; batches use all)")
    parser.add_argument("--batches", type=int, default=None, help="batch-of-32 rounds (default: all the queries hold)")
    parser.add_argument("--timed-filtered", type=int, default=None,
                        help="filtered and text rounds over the first N of --filtered-queries only")
    parser.add_argument("--filtered-queries", type=int, default=50, help="queries for the filter and text rows (default 50)")
    parser.add_argument("--configs", default="float,int8,binary,auto",
                        help=f"comma-separated, of {', '.join(CONFIGS)}; none: LanceDB alone (default float,int8,binary,auto)")
    parser.add_argument("--budget-gib", type=int, default=4, help="the collections' memory budget (auto's choice; default 4)")
    parser.add_argument("--raw-faiss", action=argparse.BooleanOptionalAction, default=True, help="raw FAISS rows (default on)")
    parser.add_argument("--lancedb", action=argparse.BooleanOptionalAction, default=True, help="LanceDB rows (default on)")
    parser.add_argument("--text", action=argparse.BooleanOptionalAction, default=True,
                        help="give every item a text (lexical and hybrid rows; default on)")
    parser.add_argument("--threads", type=int, default=1,
                        help="FAISS OpenMP threads for searches (default 1: on a shared, loaded machine an "
                             "OpenMP barrier waiting for a descheduled thread costs ~70 ms a search)")
    parser.add_argument("--build-threads", type=int, default=2, help="FAISS OpenMP threads for index builds (default 2)")
    parser.add_argument("--interleave", choices=("all", "config"), default="all",
                        help="time single queries and batches with every contender interleaved (all), or each "
                             "configuration with its own rescore-0 and raw-FAISS rows, one configuration after "
                             "another (config: back to back on one collection, as a server searches)")
    parser.add_argument("--workdir", type=Path, default=None, help="folder for the collections (default: a temporary one)")
    parser.add_argument("--keep-workdir", action="store_true", help="keep the collections (for --reuse)")
    parser.add_argument("--reuse", action="store_true",
                        help="search the collections a --keep-workdir run of the same sizes left in --workdir")


def run(args: argparse.Namespace) -> SuiteRun:
    rows = with_ratios(measure(args))
    params = {key: (str(value) if isinstance(value, Path) else value) for key, value in vars(args).items()
              if key not in ("out", "output")}
    return SuiteRun(rows, params, f"cpu ({args.threads} FAISS threads for search, {args.build_threads} for builds)",
                    "float32", text=markdown(rows))

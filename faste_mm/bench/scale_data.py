"""The scale suite's data and contenders: seeded clustered vectors on the unit sphere and Zipf-like
item texts regenerated chunk by chunk (`Data`, `Words`), the process's peak RSS (`RssPeak`), the
per-query interleaved timer (`Timer`), and the LanceDB and raw-FAISS contenders beside faste-mm's
collections. `faste_mm.bench.scale` drives them.
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import faiss
import numpy as np

from faste_mm.indexers import Collection, ItemRecord

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



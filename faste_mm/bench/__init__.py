"""faste_mm.bench: the one benchmark tool. `faste-mm bench [SUITE] ...` (or `python -m faste_mm.bench
SUITE ...`) runs one suite; every suite writes the same result schema (`schema.BenchResult`: commit,
command, device, CPU flags, dtype, torch, threads, load at start and end, then its rows) and times
its contenders side by side in mirrored rounds (`rounds`), on inputs from one spec language
(`inputs`), with options declared once (`options`). `entry` runs a suite from its arguments.

This module is only the table of suites (importing it loads nothing heavy: `faste-mm --help`
stays fast); each suite module has `add_arguments(parser)` (its options, from `options`) and
`run(args) -> SuiteRun`, or `run(args, progress)` for a suite that shows progress (the CLI hands it
a progress view).
"""

from __future__ import annotations

# name -> (module, one line for --help). "model" is also what `faste-mm bench` runs with no suite.
SUITES: dict[str, tuple[str, str]] = {
    "model": ("faste_mm.bench.model_suite", "FastE against the full forward (and HF / sentence-transformers) on the same inputs"),
    "peers": ("faste_mm.bench.peers", "faste-mm against the official transformers path and sentence-transformers: photos, pages, texts"),
    "pixels": ("faste_mm.bench.pixels", "seconds per photo and page at several pixel caps and dtypes, with the vision tower's share"),
    "tower-attention": ("faste_mm.bench.tower_attention", "one page frame's attention: fused SDPA against its pieces, and the packed tower"),
    "rerank": ("faste_mm.bench.rerank", "the reranker: official path, full forward, FastE settings, prefix reuse, tower cache"),
    "rerank-e2e": ("faste_mm.bench.rerank_e2e", "reranking pages end to end (serialization overlapped with the model)"),
    "rerank-warm": ("faste_mm.bench.rerank_warm", "a server's reranked searches over the same candidates: first, second and warm queries"),
    "batch-tokens": ("faste_mm.bench.batch_tokens", "throughput against the batch token budget"),
    "threads": ("faste_mm.bench.threads", "the machine plan's torch threads, preprocessing threads and batch tokens against each changed"),
    "scale": ("faste_mm.bench.scale", "collections at scale: float/int8/binary/auto against raw FAISS and LanceDB"),
    "search": ("faste_mm.bench.search", "one collection of random vectors: build time, query latency, recall (CPU or GPU FAISS)"),
    "pdf-memory": ("faste_mm.bench.pdf_memory", "peak RSS of `faste-mm index` on one PDF, per page count"),
    "client": ("faste_mm.bench.client", "`faste-mm search` through a running server against --no-server: wall and max RSS"),
    "startup": ("faste_mm.bench.startup", "CLI start-up: --help, --version and info in a new process"),
    "serve": ("faste_mm.bench.serve", "`faste-mm serve` embeddings under C concurrent clients"),
    "serve-load": ("faste_mm.bench.serve_load", "`faste-mm serve` /search under many clients for a while: latency and RSS"),
    "ray": ("faste_mm.bench.ray", "`index --ray` against plain `index`"),
    "video": ("faste_mm.bench.video", "video: full forward against FastE on one clip, with decoding's share"),
    "query-tokens": ("faste_mm.bench.query_tokens", "tokenizing a long query: the whole text against the serve engine's bounded cut"),
    "cpu": ("faste_mm.bench.cpu", "docs/cpu.md's figures: float32, bfloat16, int8 and transformers at the 2B width, GEMM rates, FastE check"),
    "patch-dedup": ("faste_mm.bench.patch_dedup", "pages/s of duplicate-patch removal, FastE, both and neither against transformers"),
    "library": ("faste_mm.bench.library", "photo-library features: OCR per photo and page, duplicates at scale, an idle watcher's CPU"),
    "query-words": ("faste_mm.bench.query_words", "query understanding: time per query over a fixed list in five languages"),
    "photos": ("faste_mm.bench.photos", "photo facts read against sha256 per photo; date-range search against unfiltered"),
    "album-refresh": ("faste_mm.bench.album_refresh", "albums kept current: an index run's refresh per new item at 10k and 100k items"),
    "time-estimate": ("faste_mm.bench.time_estimate", "index's first time estimate against the measured total on a mixed folder"),
}

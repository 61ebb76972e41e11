"""Benchmark `faste-mm serve`: C concurrent clients x R requests each against a local server on a
random-weight bench-shape model saved to disk, for each C; reports requests/s, items/s and
p50/p95/p99 latency per C, and the batch sizes the server formed (from /metrics).

    faste-mm bench serve --shape qwen3-vl-embedding-2b --scale-hidden 0.25 \
        --concurrency 1,4,16 --requests 8 --words 60 --out docs/bench/serve-cpu.json

The server runs as its own process (`faste-mm serve --model DIR --port 0`), as users run it;
the clients are threads with one keep-alive HTTP connection each. Every request carries
`--items` texts of `--words` words (distinct per request, so nothing is cached anywhere).
"""

from __future__ import annotations

import argparse
import logging
import os
import queue
import re
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from faste_mm.bench.options import add_shape, add_threads
from faste_mm.bench.schema import SuiteRun

log = logging.getLogger(__name__)

WORDS = ("retrieval embedding compression readout prefix layer token image page query document vector "
         "search index model batch attention cosine threshold budget").split()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_shape(parser, scale=0.25)
    parser.add_argument("--model", help="an existing model directory instead of building --shape")
    parser.add_argument("--concurrency", default="1,4,16", help="comma-separated client counts (default 1,4,16)")
    parser.add_argument("--requests", type=int, default=8, help="requests per client (default 8)")
    parser.add_argument("--items", type=int, default=1, help="texts per request (default 1)")
    parser.add_argument("--words", type=int, default=60, help="words per text (default 60)")
    parser.add_argument("--input-type", default="query", choices=("query", "document"))
    parser.add_argument("--batch-tokens", type=int, default=16384, help="the server's --batch-tokens (default 16384)")
    parser.add_argument("--max-wait-ms", type=float, default=5.0, help="the server's --max-wait-ms (default 5)")
    add_threads(parser)
    parser.add_argument("--warmup", type=int, default=2, help="requests before timing (first-call costs; default 2)")


def run(args: argparse.Namespace) -> SuiteRun:
    with tempfile.TemporaryDirectory() as workdir:
        model = args.model
        if model is None:
            from faste_mm.tools.shapes import build_shape_model

            log.info("building random-weight %s (scale %g)", args.shape, args.scale_hidden)
            model = str(build_shape_model(args.shape, Path(workdir) / "model", args.scale_hidden))
        server, url = _start_server(model, args)
        try:
            _warm_up(url, args)
            rows = [_run(url, c, args) for c in _ints(args.concurrency)]
        finally:
            server.terminate()
            server.wait(30)
    params = {"model": args.model or f"{args.shape} scale {args.scale_hidden:g} (random weights)",
              "workload": {"requests_per_client": args.requests, "items_per_request": args.items,
                           "words_per_item": args.words, "input_type": args.input_type},
              "server": {"batch_tokens": args.batch_tokens, "max_wait_ms": args.max_wait_ms, "threads": args.threads}}
    lines = ["| clients | req/s | items/s | p50 ms | p95 ms | p99 ms | mean batch |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        batch = "-" if row["mean_batch_size"] is None else f"{row['mean_batch_size']:.1f}"
        lines.append(f"| {row['concurrency']} | {row['requests_per_s']:.2f} | {row['items_per_s']:.2f} | {row['p50_ms']:.0f} | "
                     f"{row['p95_ms']:.0f} | {row['p99_ms']:.0f} | {batch} |")
    return SuiteRun(rows, params, "cpu (the server's)", text="\n".join(lines))


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def _start_server(model: str, args) -> tuple[subprocess.Popen, str]:
    command = [sys.executable, "-m", "faste_mm.cli.app", "serve", "--model", model, "--port", "0",
               "--device", "cpu", "--batch-tokens", str(args.batch_tokens), "--max-wait-ms", str(args.max_wait_ms),
               "--max-queue", "1024"] + ([] if args.threads is None else ["--threads", str(args.threads)])
    server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in server.stdout], daemon=True).start()
    line = lines.get(timeout=600)
    url = re.search(r"http://\S+", line).group(0).rstrip("/")
    return server, url


def _texts(client: int, request: int, args) -> list[str]:
    rng = np.random.default_rng(1000 * client + request)
    return [" ".join(rng.choice(WORDS, args.words)) + f" ({client}.{request}.{i})" for i in range(args.items)]


def _run(url: str, concurrency: int, args) -> dict:
    import httpx

    def client(c: int) -> list[float]:
        latencies = []
        with httpx.Client(base_url=url, timeout=600) as http:
            for r in range(args.requests):
                started = time.perf_counter()
                response = http.post("/v1/embeddings", json={"input": _texts(c, r, args), "input_type": args.input_type})
                response.raise_for_status()
                latencies.append(time.perf_counter() - started)
        return latencies

    before = _batch_sizes(url)
    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        latencies = np.array([x for chunk in pool.map(client, range(concurrency)) for x in chunk])
    elapsed = time.perf_counter() - started
    after = _batch_sizes(url)
    n = concurrency * args.requests
    batches = after[1] - before[1]
    row = {
        "concurrency": concurrency,
        "requests": n,
        "seconds": elapsed,
        "requests_per_s": n / elapsed,
        "items_per_s": n * args.items / elapsed,
        "p50_ms": 1000 * float(np.percentile(latencies, 50)),
        "p95_ms": 1000 * float(np.percentile(latencies, 95)),
        "p99_ms": 1000 * float(np.percentile(latencies, 99)),
        "mean_batch_size": (after[0] - before[0]) / batches if batches else None,
    }
    log.info("C=%d: %.2f req/s, p50 %.0f ms", concurrency, row["requests_per_s"], row["p50_ms"])
    return row


def _warm_up(url: str, args) -> None:
    """First calls pay one-off costs (allocator growth, lazy imports); keep them out of the timings."""
    import httpx

    for r in range(args.warmup):
        httpx.post(url + "/v1/embeddings", json={"input": _texts(999, r, args), "input_type": args.input_type},
                   timeout=600).raise_for_status()


def _batch_sizes(url: str) -> tuple[float, float]:
    """(sum, count) of the server's faste_mm_batch_size histogram over every kind."""
    import httpx

    text = httpx.get(url + "/metrics").text
    total = sum(float(m) for m in re.findall(r"^faste_mm_batch_size_sum\{[^}]*\} (\S+)", text, re.M))
    count = sum(float(m) for m in re.findall(r"^faste_mm_batch_size_count\{[^}]*\} (\S+)", text, re.M))
    return total, count

"""Bounded load on `faste-mm serve`: many concurrent clients (default 64) search a small
collection for a fixed time (and at most a fixed number of requests) on loopback, while the
server's resident memory is sampled; reports answers by status, requests/s, latency percentiles
and whether memory stayed flat (the median RSS of the last tenth of the run against the first).

    faste-mm bench serve-load --clients 64 --seconds 30 --out docs/bench/serve-load.json

The server runs as its own process (`faste-mm serve -c DIR --port 0`) on a tiny random-weight
model and generated images unless --model/--collection name real ones. Traffic goes only to
127.0.0.1; the run stops by itself at --seconds or --max-requests, whichever comes first.
"""

from __future__ import annotations

import argparse
import http.client
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from faste_mm.bench.schema import SuiteRun
from faste_mm.errors import ConfigError

QUERIES = ("a red bicycle", "sunset over the sea", "a quarterly report", "forest at dawn", "a cat on a sofa",
           "snow on the mountains", "an invoice from march", "city lights at night")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--clients", type=int, default=64, help="concurrent clients (default 64)")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of the load phase (default 30)")
    parser.add_argument("--max-requests", type=int, default=20_000, help="stop after this many requests in all (default 20,000)")
    parser.add_argument("--model", help="model directory (default: a tiny random-weight Qwen3-VL)")
    parser.add_argument("--collection", help="collection directory (default: --images generated images)")
    parser.add_argument("--images", type=int, default=24, help="generated images without --collection (default 24)")
    parser.add_argument("--threads", type=int, default=1, help="the server's --threads (default 1)")


def run(args: argparse.Namespace) -> SuiteRun:
    if args.clients < 1 or args.seconds <= 0 or args.max_requests < 1:
        raise ConfigError("--clients, --seconds and --max-requests must be positive")
    with tempfile.TemporaryDirectory(prefix="faste-mm-load-") as workdir:
        collection = Path(args.collection) if args.collection else _make_collection(Path(workdir), args.model, args.images)
        server, port = _start_server(collection, args.threads)
        try:
            report = _load(server.pid, port, args)
        finally:
            server.terminate()
            server.wait(timeout=60)
    params = {"clients": args.clients, "seconds": args.seconds, "max_requests": args.max_requests,
              "collection": str(args.collection or f"generated ({args.images} images)"), "server_threads": args.threads}
    r = report
    text = "\n".join(["| clients | requests | req/s | p50 ms | p95 ms | p99 ms | RSS MB first / last tenth (max) | memory flat |",
                      "|---:|---:|---:|---:|---:|---:|---|---|",
                      f"| {args.clients} | {r['requests']} | {r['requests_per_s']} | {r['latency_ms']['p50']} | {r['latency_ms']['p95']} | "
                      f"{r['latency_ms']['p99']} | {r['rss_mib']['first_tenth_median']} / {r['rss_mib']['last_tenth_median']} "
                      f"({r['rss_mib']['max']}) | {r['memory_flat']} |"])
    return SuiteRun([report], params, "cpu (the server's)", text=text)


def _make_collection(workdir: Path, model: str | None, n: int = 24) -> Path:
    from faste_mm import Retriever
    from faste_mm.retrieval.model_spec import ModelSpec
    from faste_mm.testing import build_tiny_model
    from PIL import Image

    model = model or str(build_tiny_model(workdir / "model", "qwen3_vl"))
    images = workdir / "images"
    images.mkdir()
    rng = np.random.default_rng(0)
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(images / f"{i:02d}.png")
    with Retriever(ModelSpec(model, device="cpu"), collection=workdir / "col", r_max=0.5) as retriever:
        retriever.index([images])
    return workdir / "col"


def _start_server(collection: Path, threads: int) -> tuple[subprocess.Popen, int]:
    server = subprocess.Popen([sys.executable, "-m", "faste_mm.cli.app", "serve", "-c", str(collection), "--host",
                               "127.0.0.1", "--port", "0", "--device", "cpu", "--threads", str(threads),
                               "--max-queue", "1024"], stdout=subprocess.PIPE, text=True)
    line = server.stdout.readline()  # printed once the model is loaded and the socket listens
    if not line.startswith("serving on http://127.0.0.1:"):
        server.kill()
        raise ConfigError(f"the server did not start: {line!r}")
    return server, int(line.rsplit(":", 1)[1].strip().rstrip("/"))


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _load(pid: int, port: int, args) -> dict:
    deadline = time.monotonic() + args.seconds
    budget = threading.Semaphore(args.max_requests)  # every request takes one: bounded in count
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    lock = threading.Lock()
    rss: list[tuple[float, int]] = []
    stop = threading.Event()

    def sample() -> None:
        started = time.monotonic()
        while not stop.wait(0.5):
            rss.append((time.monotonic() - started, _rss_bytes(pid)))

    def client(index: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        n = 0
        while time.monotonic() < deadline and budget.acquire(blocking=False):
            body = json.dumps({"query": f"{QUERIES[(index + n) % len(QUERIES)]} {index}-{n}", "k": 5})
            started = time.perf_counter()
            try:
                connection.request("POST", "/search", body, {"Content-Type": "application/json"})
                response = connection.getresponse()
                response.read()
                status = str(response.status)
            except OSError as error:
                status = type(error).__name__
                connection.close()
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            with lock:
                latencies.append(time.perf_counter() - started)
                statuses[status] = statuses.get(status, 0) + 1
            n += 1
        connection.close()

    rss.append((0.0, _rss_bytes(pid)))  # the first and (below) last samples: a short run has both ends
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.monotonic()
    workers = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    elapsed = time.monotonic() - started
    stop.set()
    sampler.join()
    rss.append((elapsed, _rss_bytes(pid)))
    values = np.array([value for _, value in rss], dtype=np.float64)
    tenth = max(1, len(values) // 10)
    first, last = float(np.median(values[:tenth])), float(np.median(values[-tenth:]))
    lat = np.array(latencies) * 1000
    return {
        "requests": len(latencies), "statuses": statuses, "seconds": round(elapsed, 1),
        "requests_per_s": round(len(latencies) / elapsed, 1),
        "latency_ms": {p: round(float(np.percentile(lat, q)), 1) for p, q in (("p50", 50), ("p95", 95), ("p99", 99))},
        "rss_mib": {"first_tenth_median": round(first / 2**20, 1), "last_tenth_median": round(last / 2**20, 1),
                    "max": round(float(values.max()) / 2**20, 1), "samples": len(values)},
        "rss_growth": round(last / first - 1, 4),
        "memory_flat": last <= first * 1.10,  # within 10% of where the load began
    }


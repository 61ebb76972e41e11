"""The client suite: `faste-mm search`, `info` and `explain` answered by the collection's running
`faste-mm serve` (the thin client: no torch, transformers or FAISS imported) against the same
command with `--no-server` (the work done in the command's process), side by side in mirrored
rounds, each run a new process as a person typing it feels it: wall seconds and the process's peak
RSS (/usr/bin/time's %M). For reference, the same search as one HTTP request from this process.

    faste-mm bench client --repeats 4
    faste-mm bench client --collection ~/photos.fmm --query "a red bicycle" --rerank Qwen/Qwen3-VL-Reranker-2B

Without --collection, a collection of 24 generated images is indexed with a tiny random-weight
Qwen3-VL and served with a tiny random-weight reranker (faste_mm.testing), so the no-server figures
are lower bounds: a real model loads longer. `explain` is measured when there is a reranker (the
generated one, or --rerank), on the query's best hit. Both sides must print the same answer (search:
the hits' ids in order; info: the whole report; explain: the item, layer and score to 4 places);
a row says whether they did.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import tempfile
import time
import urllib.request
from functools import partial
from pathlib import Path

from faste_mm.bench.options import add_rounds, faste_mm_command
from faste_mm.bench.rounds import mirrored_rounds
from faste_mm.bench.schema import SuiteRun
from faste_mm.errors import ConfigError
from faste_mm.retrieval.search_request import DEFAULTS, check_option

log = logging.getLogger(__name__)

HTTP_ONLY = "search: http only (this process)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--collection", type=Path, default=None,
                        help="an existing collection to serve and search (default: 24 generated images, tiny model)")
    parser.add_argument("--images", type=int, default=24, help="generated images without --collection (default 24)")
    parser.add_argument("--query", default="a red bicycle by the river", help="the text searched and explained")
    parser.add_argument("-k", dest="k", type=int, default=DEFAULTS["k"],
                        help=f"results per search (default {DEFAULTS['k']}, the search option's)")
    parser.add_argument("--rerank", default=None,
                        help="the reranker the server loads and explain uses (default: a tiny random-weight one for "
                             "the generated collection; with --collection and no --rerank, explain is not measured)")
    parser.add_argument("--faste-mm", dest="faste_mm", default=None,
                        help="the faste-mm executable to time (default: the one beside this Python)")
    add_rounds(parser, default=4)


def run(args: argparse.Namespace) -> SuiteRun:
    if args.repeats < 1:
        raise ConfigError(f"--repeats must be >= 1, got {args.repeats}")
    check_option("k", args.k, "http")  # the server's bounds of k, as the search option declares them
    command = faste_mm_command(args.faste_mm)
    with tempfile.TemporaryDirectory(prefix="faste-mm-bench-client-") as workdir:
        work = Path(workdir)
        collection = args.collection or _make_collection(work, args.images)
        reranker = args.rerank or (None if args.collection else _make_reranker(work))
        server, url = _start_server(command, collection, reranker)
        try:
            shared = ["-c", str(collection), "--format", "json"]
            argvs = {"search": [*command, "search", args.query, *shared, "-k", str(args.k)],
                     "info": [*command, "info", *shared]}
            if reranker is not None:  # on the query's best hit
                best = _http(url, collection, args.query, 1)[2][0]
                argvs["explain"] = [*command, "explain", args.query, str(best), *shared, "--rerank", reranker]
            contenders = {}
            for name, argv in argvs.items():
                contenders[f"{name}: server"] = partial(_child, argv, work, name)
                contenders[f"{name}: no-server"] = partial(_child, [*argv, "--no-server"], work, name)
            contenders[HTTP_ONLY] = partial(_http, url, collection, args.query, args.k)
            timed = mirrored_rounds(contenders, args.repeats)
        finally:
            server.terminate()
            server.wait(timeout=60)
    rows = []
    for name, t in timed.items():
        command_name = name.split(":")[0]
        rss = [output[1] for output in t.outputs]
        rows.append({"contender": name, "command": command_name, "wall_s_median": round(t.median, 4),
                     "wall_s_min": round(t.best, 4), "wall_s_max": round(max(t.seconds), 4),
                     "wall_s": [round(s, 4) for s in t.seconds],
                     "max_rss_mb": None if None in rss else round(max(rss) / 2**20, 1),
                     "same_as_no_server": t.output[2] == timed[f"{command_name}: no-server"].output[2]})
    ratios = {name: round(timed[f"{name}: no-server"].median / timed[f"{name}: server"].median, 2) for name in argvs}
    params = {"collection": str(args.collection) if args.collection else f"generated ({args.images} images, tiny model)",
              "query": args.query, "k": args.k, "repeats": args.repeats, "command": command,
              "reranker": reranker if args.rerank else ("tiny random-weight" if reranker else None),
              "no_server_over_server": ratios}
    return SuiteRun(rows, params, device="cpu (the server's and the --no-server process's)", text=_table(rows, params))


def _make_collection(workdir: Path, n: int) -> Path:
    """n generated images indexed with a tiny random-weight Qwen3-VL."""
    import numpy as np
    from PIL import Image

    from faste_mm import Retriever
    from faste_mm.retrieval.model_spec import ModelSpec
    from faste_mm.testing import build_tiny_model

    model = build_tiny_model(workdir / "model", "qwen3_vl")
    images = workdir / "images"
    images.mkdir()
    rng = np.random.default_rng(0)
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(images / f"{i:02d}.png")
    with Retriever(ModelSpec(str(model), device="cpu"), collection=workdir / "col", r_max=0.5) as retriever:
        retriever.index([images])
    return workdir / "col"


def _make_reranker(workdir: Path) -> str:
    """A tiny random-weight Qwen3-VL reranker (the server's --rerank, explain's model)."""
    from faste_mm.testing import build_tiny_model

    return str(build_tiny_model(workdir / "reranker", "qwen3_vl_reranker"))


def _start_server(command: list[str], collection: Path, reranker: str | None) -> tuple[subprocess.Popen, str]:
    server = subprocess.Popen([*command, "serve", "-c", str(collection), "--host", "127.0.0.1", "--port", "0",
                               "--device", "cpu", "--threads", "1", *(["--rerank", reranker] if reranker else [])],
                              stdout=subprocess.PIPE, text=True)
    line = server.stdout.readline()  # printed once the server is announced and listens
    if not line.startswith("serving on http://127.0.0.1:"):
        server.kill()
        raise ConfigError(f"faste-mm serve did not start for {collection}: it printed {line!r}")
    return server, line.split("serving on ", 1)[1].strip().rstrip("/") + "/"


def _child(argv: list[str], workdir: Path, command: str) -> tuple[float, int | None, object]:
    """Run one command's process: (wall s, its peak RSS in bytes, what must be equal both ways).
    The peak comes from /usr/bin/time (%M), whose own small process forks the command: a child
    forked from this process would report this process's RSS at the fork (Linux keeps ru_maxrss
    across exec)."""
    out, peak = workdir / "stdout.json", workdir / "maxrss.txt"
    timer = ["/usr/bin/time", "-f", "%M", "-o", str(peak)] if Path("/usr/bin/time").exists() else []
    started = time.perf_counter()
    with open(out, "wb") as sink:
        done = subprocess.run([*timer, *argv], stdout=sink, stderr=subprocess.DEVNULL,
                              env={**os.environ, "FASTE_MM_DEVICE": "cpu"})
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise ConfigError(f"{' '.join(argv)} exited {done.returncode}; run it by hand to see why")
    rss = int(peak.read_text().split()[-1]) * 1024 if timer else None
    return wall, rss, _answer(command, json.loads(out.read_text()))


def _answer(command: str, printed: dict) -> object:
    """What a command's two ways must print alike: the hits' ids, the whole report, or the
    explained item with its layer and score (two processes' last float digits may differ)."""
    if command == "search":
        return [hit["id"] for hit in printed["hits"]]
    if command == "explain":
        return printed["item"], printed["layer"], round(printed["score"], 4)
    return printed


def _http(url: str, collection: Path, query: str, k: int) -> tuple[float, None, list]:
    """The same search as one POST /search from this process (the floor any client pays)."""
    from faste_mm.serving.discovery import find_server

    address = find_server(collection)
    started = time.perf_counter()
    request = urllib.request.Request(url + "search", data=json.dumps({"query": query, "k": k}).encode(),
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Bearer {address.token}" if address else ""})
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=60) as response:
        hits = json.loads(response.read())["hits"]
    return time.perf_counter() - started, None, [hit["id"] for hit in hits]


def _table(rows: list[dict], params: dict) -> str:
    ratios = ", ".join(f"{name} {ratio}x" for name, ratio in params["no_server_over_server"].items())
    lines = [f"`faste-mm search / info / explain` over {params['collection']}, -k {params['k']}; median of "
             f"{params['repeats']} mirrored rounds (new process each); --no-server / server: {ratios}",
             "", "| command: path | wall s median (min-max) | max RSS MB | same answer as --no-server |",
             "|---|---:|---:|---|"]
    for row in rows:
        rss = "-" if row["max_rss_mb"] is None else f"{row['max_rss_mb']:.0f}"
        lines.append(f"| {row['contender']} | {row['wall_s_median']:.3f} ({row['wall_s_min']:.3f}-{row['wall_s_max']:.3f}) "
                     f"| {rss} | {'yes' if row['same_as_no_server'] else 'NO'} |")
    return "\n".join(lines)

"""Benchmark `index --ray` against plain `index` on this machine (CPU, or one GPU).

Builds a random-weight model of a bench shape (faste_mm.tools.shapes) on disk, writes a folder
of random images, then indexes it into fresh collections:

  plain           Retriever.index, one process (torch's default threads, or --threads)
  ray-1           --ray with 1 embedding actor (--overhead-cpus CPUs, the plain run's threads)
  ray-scale-1/2   --ray with 1 and 2 actors of 1 CPU each (the scaling pair)

items/s is measured in the steady state, from the first commit to the last (model loading and
actor start-up excluded, they are reported apart as "first commit s"); wall s is the whole call.
Efficiency = (items/s with 2 actors / items/s with 1) / 2.

    faste-mm bench ray --n 32 --repeats 1 --threads 1 --overhead-cpus 1 \
        --runs plain,ray-1,ray-scale-2 --out docs/bench/ray-cpu.json
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import time
from pathlib import Path

import numpy as np
from PIL import Image

from faste_mm.bench.options import add_device, add_model, add_rounds, add_shape, add_threads, names, scratch
from faste_mm.bench.schema import SuiteRun

log = logging.getLogger(__name__)


def make_images(root: Path, n: int, size: int) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / f"img{i:04d}.png")
    return root


def timed_index(model_dir: Path, images: Path, collection: Path, args, ray_options=None) -> dict:
    from faste_mm import BatchingConfig, Retriever, SerializerConfig
    from faste_mm.retrieval.results import IndexOptions
    from faste_mm.retrieval.model_spec import ModelSpec
    from faste_mm.scale import RayExecutor

    shutil.rmtree(collection, ignore_errors=True)
    spec = ModelSpec(str(model_dir), device=args.device, batching=BatchingConfig(),
                     serializer=SerializerConfig(max_pixels=args.max_pixels))
    marks: list[tuple[float, int]] = []
    started = time.perf_counter()

    def progress(p) -> None:
        marks.append((time.perf_counter() - started, p.embedded + p.reused))

    with Retriever(spec, collection=collection, r_max=args.r_max) as retriever:
        report = retriever.index([images], options=IndexOptions(chunk_files=args.chunk_files), progress=progress,
                                 executor=None if ray_options is None else RayExecutor(ray_options))
    wall = time.perf_counter() - started
    committed = [(t, n) for t, n in marks if n > 0]
    (t0, n0), (t1, n1) = committed[0], committed[-1]
    return {"wall_s": wall, "first_commit_s": t0, "items": report.embedded,
            "steady_items_per_s": (n1 - n0) / (t1 - t0) if t1 > t0 else float("nan"),
            "prefix_removal": report.prefix_removal}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_shape(parser, scale=0.25)
    add_model(parser)
    parser.add_argument("--n", type=int, default=48, help="images (default 48)")
    parser.add_argument("--size", type=int, default=256, help="image side, pixels (default 256)")
    parser.add_argument("--max-pixels", type=int, default=256 * 256, help="pixel cap (default 65,536)")
    parser.add_argument("--r-max", type=float, default=0.5, help="FastE r_max (default 0.5)")
    parser.add_argument("--chunk-files", type=int, default=8, help="files per committed chunk (default 8)")
    parser.add_argument("--files-per-call", type=int, default=8, help="files per Ray call (default 8)")
    add_device(parser, dtype=False)
    parser.add_argument("--gpus-per-worker", type=float, default=0.0, help="GPUs per Ray actor (default 0)")
    add_threads(parser)
    parser.add_argument("--overhead-cpus", type=float, default=2.0, help="CPUs of the 1-actor overhead run (default 2)")
    parser.add_argument("--ray-cpus", type=int, default=4, help="logical CPUs of the local Ray (default 4)")
    add_rounds(parser, default=3)
    parser.add_argument("--runs", default="plain,ray-1,ray-scale-1,ray-scale-2", help="runs, comma-separated (default all four)")
    parser.add_argument("--work", type=Path, default=None, help="folder for the model and images (kept)")


def run(args: argparse.Namespace) -> SuiteRun:
    import ray
    import torch

    if args.threads is not None:  # the plain run embeds in this process
        torch.set_num_threads(args.threads)

    from faste_mm.scale import RayOptions
    from faste_mm.tools.shapes import build_shape_model

    with scratch(args.work, "bench-ray-") as work:  # removed at the end unless --work was given
        model_dir = args.model or work / f"{args.shape}-{args.scale_hidden}"
        if not (model_dir / "config.json").exists():
            build_shape_model(args.shape, model_dir, args.scale_hidden)
        images = make_images(work / f"images-{args.n}-{args.size}", args.n, args.size)
        ray.init(num_cpus=args.ray_cpus, include_dashboard=False, log_to_driver=False)
        gpus = args.gpus_per_worker

        def options(workers: int, cpus: float) -> RayOptions:
            return RayOptions(workers=workers, gpus_per_worker=gpus, cpus_per_worker=cpus,
                              files_per_call=args.files_per_call)

        try:
            runs = {"plain": None, "ray-1": options(1, args.overhead_cpus),
                    "ray-scale-1": options(1, 1.0), "ray-scale-2": options(2, 1.0)}
            chosen = names(args.runs)
            results: dict[str, list[dict]] = {name: [] for name in chosen}
            for repeat in range(args.repeats):  # interleaved, so drifting load hits every setting alike
                for name in chosen:
                    result = timed_index(model_dir, images, work / f"col-{name}", args, runs[name])
                    results[name].append(result)
                    log.info("repeat %d %s: %s", repeat, name, json.dumps(result))
        finally:
            ray.shutdown()
    summary = {name: {key: statistics.median(r[key] for r in rs) for key in rs[0]} for name, rs in results.items()}
    ratios = {}
    if "plain" in summary and "ray-1" in summary:
        ratios["overhead_ray1_vs_plain"] = 1 - summary["ray-1"]["steady_items_per_s"] / summary["plain"]["steady_items_per_s"]
    # With --overhead-cpus 1 the overhead run is the scaling pair's 1-actor run.
    one = "ray-scale-1" if "ray-scale-1" in summary else "ray-1" if args.overhead_cpus == 1 else None
    if one in summary and "ray-scale-2" in summary:
        speedup = summary["ray-scale-2"]["steady_items_per_s"] / summary[one]["steady_items_per_s"]
        ratios.update(speedup_2_vs_1=speedup, efficiency_2=speedup / 2)
    rows = [{"run": name, **values, "rounds": results[name]} for name, values in summary.items()]
    params = {"shape": args.shape, "scale_hidden": args.scale_hidden, "n": args.n, "size": args.size,
              "max_pixels": args.max_pixels, "r_max": args.r_max, "ray_cpus": args.ray_cpus,
              "overhead_cpus": args.overhead_cpus, "repeats": args.repeats, **ratios}
    text = "\n".join(["| run | steady items/s | wall s | first commit s |", "|---|---:|---:|---:|",
                      *(f"| {r['run']} | {r['steady_items_per_s']:.2f} | {r['wall_s']:.1f} | {r['first_commit_s']:.1f} |" for r in rows),
                      "", ", ".join(f"{k} {v:.2f}" for k, v in ratios.items())])
    return SuiteRun(rows, params, args.device, text=text)

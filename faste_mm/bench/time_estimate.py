"""How honest `index`'s time estimate is: a mixed folder (photos of varied sizes, multi-page PDFs
with a text layer, text notes) indexed by `faste-mm index` in a child process; the estimate it
first settled on (once the first items of each kind were measured) against the run's measured
seconds, and the error.

    faste-mm bench time-estimate --items 200 --runs 3 --out docs/bench/time-estimate-cpu.json

The model is a tiny random-weight one (`faste_mm.testing`) unless `--model DIR` gives another.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

from faste_mm.bench.options import add_dtype, add_model, add_workdir, scratch
from faste_mm.bench.pdf_memory import text_pdf
from faste_mm.bench.schema import SuiteRun
from faste_mm.errors import ConfigError

# Photo sizes drawn in turn: phone landscape and portrait, a small web image, a square, a scan.
PHOTO_SIZES = ((4032, 3024), (3024, 4032), (640, 480), (1200, 1200), (2480, 3508), (1600, 900))
PDF_PAGES = (2, 3, 4, 6, 8)  # pages of the PDFs, in turn
# Shares of the folder's items: photos, PDF pages, notes.
SHARES = (0.5, 0.3, 0.2)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--items", type=int, default=200,
                        help="items in the folder (default 200: half photos, 30%% PDF pages, 20%% notes)")
    parser.add_argument("--max-pixels", type=int, default=262_144,
                        help="the collection's pixel cap per photo and page (default 262144 = 256 visual tokens)")
    add_dtype(parser, what="The model's dtype (as index --dtype)")
    parser.add_argument("--runs", type=int, default=3, help="index runs, each into a new collection (default 3)")
    add_model(parser)
    add_workdir(parser)


def run(args: argparse.Namespace) -> SuiteRun:
    if args.items < 10 or args.runs < 1:
        raise ConfigError(f"--items {args.items} --runs {args.runs}: give at least 10 items (the folder mixes "
                          f"three kinds) and 1 run")
    rows = []
    with scratch(args.workdir, "bench-estimate-") as work:
        if args.model is not None:
            model, model_name = args.model, str(args.model)
        else:
            from faste_mm.testing import build_tiny_model

            model, model_name = build_tiny_model(work / "model", "qwen3_vl"), "tiny qwen3_vl (random weights)"
        counts = write_mixed_folder(work / "folder", args.items)
        for run_index in range(args.runs):
            report, wall_s = index_folder(work / "folder", work / f"collection-{run_index}", model, args.max_pixels,
                                          args.dtype)
            rows.append(_row(run_index, report, wall_s, counts))
    errors = [row["error"] for row in rows]
    params = {"items": args.items, "runs": args.runs, "max_pixels": args.max_pixels, "dtype": args.dtype,
              "model": model_name, "photo_sizes": [f"{w}x{h}" for w, h in PHOTO_SIZES], "pdf_pages": list(PDF_PAGES)}
    text = "\n".join([f"{sum(counts.values())} items ({counts['photos']} photos, {counts['pages']} PDF pages, "
                       f"{counts['notes']} notes):",
                       *(f"run {r['run']}: estimated {r['estimated_s']:.1f} s at {r['estimated_at_s']:.1f} s, measured "
                         f"{r['measured_s']:.1f} s, error {r['error']:+.1%}" for r in rows),
                       f"largest error {max(errors, key=abs):+.1%}"])
    return SuiteRun(rows, params, "cpu", args.dtype, text=text)


def _row(run_index: int, report: dict, wall_s: float, counts: dict[str, int]) -> dict:
    """One run's row: the first estimate against the measured seconds."""
    if report.get("estimated_s") is None:
        raise ConfigError("index reported no estimate (nothing was embedded?)")
    return {"run": run_index, "items": sum(counts.values()), **{f"{k}_items": n for k, n in counts.items()},
            "embedded": report["embedded"], "estimated_s": round(report["estimated_s"], 2),
            "estimated_at_s": round(report["estimated_at_s"], 2), "measured_s": round(report["elapsed_s"], 2),
            "child_wall_s": round(wall_s, 2), "error": round(report["estimated_s"] / report["elapsed_s"] - 1, 4),
            "model_s": round(report["tower_s"] + report["decoder_s"], 2)}


def write_mixed_folder(folder: Path, n_items: int, seed: int = 0) -> dict[str, int]:
    """A folder of about `n_items` items: photos (JPEGs of `PHOTO_SIZES` in turn, smooth
    random content), PDFs of `PDF_PAGES` pages in turn with a text layer, and Markdown notes
    of 200 B to 20 kB, in three subfolders; returns the items of each ("photos", "pages", "notes")."""
    rng = np.random.default_rng(seed)
    n_photos, n_pages = round(n_items * SHARES[0]), round(n_items * SHARES[1])
    n_notes = n_items - n_photos - n_pages
    for sub in ("photos", "papers", "notes"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    for i in range(n_photos):
        width, height = PHOTO_SIZES[i % len(PHOTO_SIZES)]
        base = rng.integers(0, 256, (max(height // 64, 1), max(width // 64, 1), 3), dtype=np.uint8)
        Image.fromarray(base).resize((width, height)).save(folder / "photos" / f"IMG_{i:04d}.jpg", quality=85)
    pages, i = 0, 0
    while pages < n_pages:
        count = min(PDF_PAGES[i % len(PDF_PAGES)], n_pages - pages)
        text_pdf(folder / "papers" / f"paper-{i:03d}.pdf", count)
        pages, i = pages + count, i + 1
    words = "the quick brown fox jumps over the lazy dog while notes about trips and receipts pile up".split()
    for i in range(n_notes):
        n_words = int(rng.integers(40, 4000))
        text = " ".join(words[j] for j in rng.integers(0, len(words), n_words))
        (folder / "notes" / f"note-{i:03d}.md").write_text(f"# Note {i}\n\n{text}\n", encoding="utf-8")
    return {"photos": n_photos, "pages": n_pages, "notes": n_notes}


def index_folder(folder: Path, collection: Path, model: Path, max_pixels: int, dtype: str) -> tuple[dict, float]:
    """`faste-mm index FOLDER` into a new collection in a child process: its JSON report and wall seconds."""
    command = [sys.executable, "-m", "faste_mm.cli.app", "index", str(folder), "-c", str(collection),
               "--model", str(model), "--max-pixels", str(max_pixels), "--device", "cpu", "--dtype", dtype,
               "--format", "json"]
    started = time.perf_counter()
    proc = subprocess.run(command, env=dict(os.environ), capture_output=True, text=True)
    wall_s = time.perf_counter() - started
    if proc.returncode != 0:
        raise ConfigError(f"faste-mm index failed ({proc.returncode}): {proc.stderr[-3000:]}")
    return json.loads(proc.stdout), wall_s

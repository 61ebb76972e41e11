"""Peak RSS of `faste-mm index` on one PDF of blank (or text) pages, per page count: one fresh
`faste-mm index` process per case, measured by /usr/bin/time (%M, the child's peak resident set).
Memory should be flat in the page count: pages are rendered only when their batch is prepared and
what a batch and preprocessing hold is bounded in bytes (BatchingConfig.batch_bytes, prefetch_bytes).

The model is the tiny random-weight Qwen3-VL of `faste_mm.testing` (real processor, default
batching). Each collection is created first with the page pixel cap `--max-pixels` (a smaller
image budget than the default 1,843,200 keeps 2,000 pages within minutes on a CPU; the bytes a
batch holds are the same per token either way), then indexed by the measured process.

    faste-mm bench pdf-memory --pages 1 100 2000 --max-pixels 65536 --out out.json
    faste-mm bench pdf-memory --pages 1 25 100 --max-pixels 1843200 --text   # pages of text
    # another checkout's code (e.g. main, exported with git archive) in the measured process:
    faste-mm bench pdf-memory --pages 1 100 --source /tmp/main-src
    faste-mm bench pdf-memory --pages 1 100 --index-option=--batch-tokens --index-option=2048   # more index options
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from faste_mm.bench.schema import SuiteRun
from faste_mm.errors import ConfigError

log = logging.getLogger(__name__)


def blank_pdf(path: Path, pages: int) -> Path:
    """A PDF of `pages` blank US-letter pages."""
    import pypdfium2 as pdfium

    pdf = pdfium.PdfDocument.new()
    for _ in range(pages):
        pdf.new_page(612, 792)
    pdf.save(path)
    pdf.close()
    return path


def text_pdf(path: Path, pages: int) -> Path:
    """A PDF of `pages` US-letter pages, each 40 lines of Helvetica text (a text layer to extract)."""
    import pypdfium2 as pdfium
    import pypdfium2.raw as raw

    pdf = pdfium.PdfDocument.new()
    for number in range(pages):
        page = pdf.new_page(612, 792)
        for line in range(40):
            text = raw.FPDFPageObj_NewTextObj(pdf.raw, b"Helvetica", 11.0)
            words = f"Page {number + 1}, line {line + 1}: the quick brown fox jumps over the lazy dog."
            wide = ctypes.create_string_buffer(words.encode("utf-16-le") + b"\0\0")
            raw.FPDFText_SetText(text, ctypes.cast(wide, ctypes.POINTER(raw.FPDF_WCHAR)))
            raw.FPDFPageObj_Transform(text, 1, 0, 0, 1, 54, 740 - 17 * line)
            raw.FPDFPage_InsertObject(page.raw, text)
        raw.FPDFPage_GenerateContent(page.raw)
    pdf.save(path)
    pdf.close()
    return path


def new_collection(root: Path, model: Path, max_pixels: int, workdir: Path) -> None:
    """Create a collection whose pages are embedded at `max_pixels` (indexing one small image)."""
    from PIL import Image

    from faste_mm import Embedder, Retriever
    from faste_mm.model.serialization import SerializerConfig

    seed = workdir / "seed.png"
    Image.new("RGB", (64, 64), "white").save(seed)
    embedder = Embedder.from_pretrained(str(model), device="cpu", serializer=SerializerConfig(max_pixels=max_pixels))
    with Retriever(embedder, collection=root) as retriever:
        retriever.index([seed])


def measure(pdf: Path, collection: Path, source: Path | None, extra: list[str]) -> dict:
    """Run `faste-mm index` on `pdf` in a child process; its peak RSS and wall time."""
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = f"{source}{os.pathsep}{env.get('PYTHONPATH', '')}"
    command = ["/usr/bin/time", "-f", "%M", sys.executable, "-m", "faste_mm.cli.app", "index", str(pdf),
               "-c", str(collection), "--device", "cpu", "--format", "json", *extra]
    started = time.perf_counter()
    proc = subprocess.run(command, env=env, capture_output=True, text=True)
    wall_s = time.perf_counter() - started
    if proc.returncode != 0:
        raise ConfigError(f"faste-mm index failed ({proc.returncode}): {proc.stderr[-3000:]}")
    peak_kb = int(proc.stderr.strip().splitlines()[-1])
    report = json.loads(proc.stdout)
    return {"peak_rss_mb": round(peak_kb / 1024), "wall_s": round(wall_s, 1), "embedded": report["embedded"]}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pages", type=int, nargs="+", default=[1, 100, 2000], help="page counts (default 1 100 2000)")
    parser.add_argument("--max-pixels", type=int, default=65536, help="pixel cap of the pages (default 65536)")
    parser.add_argument("--text", action="store_true", help="pages of text instead of blank pages")
    parser.add_argument("--source", type=Path, help="put this checkout first on the child's PYTHONPATH")
    parser.add_argument("--index-option", dest="extra", action="append", default=[],
                        help="one more `faste-mm index` option word (repeatable)")


def run(args: argparse.Namespace) -> SuiteRun:
    from faste_mm.testing import build_tiny_model

    cases = {}
    make_pdf, kind = (text_pdf, "text") if args.text else (blank_pdf, "blank")
    with tempfile.TemporaryDirectory() as folder:
        workdir = Path(folder)
        model = build_tiny_model(workdir / "model", "qwen3_vl")
        for pages in args.pages:
            collection = workdir / f"col-{pages}"
            new_collection(collection, model, args.max_pixels, workdir)
            cases[pages] = measure(make_pdf(workdir / f"{kind}-{pages}.pdf", pages), collection, args.source,
                                   args.extra)
            log.info("%5d pages: peak RSS %s MB, %s s", pages, cases[pages]["peak_rss_mb"], cases[pages]["wall_s"])
    first = cases[args.pages[0]]["peak_rss_mb"]
    rows = [{"pages": p, **c, "ratio_to_first": round(c["peak_rss_mb"] / first, 2)} for p, c in cases.items()]
    params = {"pages_kind": kind, "max_pixels": args.max_pixels, "source": str(args.source) if args.source else "this checkout",
              "index_options": args.extra, "model": "tiny qwen3_vl (random weights)"}
    text = "\n".join(["| pages | peak RSS MB | wall s | embedded | x first |", "|---:|---:|---:|---:|---:|",
                      *(f"| {r['pages']} | {r['peak_rss_mb']} | {r['wall_s']} | {r['embedded']} | {r['ratio_to_first']} |" for r in rows)])
    return SuiteRun(rows, params, "cpu", text=text)

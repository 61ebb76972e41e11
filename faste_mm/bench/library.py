"""What the photo-library features cost (no model weights needed): OCR seconds per photo and per
scanned page, duplicates over N synthetic vectors, and the CPU an idle folder watcher spends.

    faste-mm bench library --out docs/bench/library.json
    faste-mm bench library --quick            # 20k vectors, 2k files, 20 s idle, one OCR round

OCR reads REAL rendered text (a number plate in a photo, an invoice, a scanned PDF page without a
text layer: the same pictures tests/test_ocr.py searches) and needs the ocr extra
(`pip install 'faste-mm[ocr]'`). One row per part (--parts).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from faste_mm.bench.options import add_rounds, names
from faste_mm.bench.schema import SuiteRun
from faste_mm.errors import ConfigError

PARTS = ("ocr", "duplicates", "watch")
# (full, --quick): vectors for duplicates, files watched, idle seconds watched, OCR rounds
_SIZES = {"n": (100_000, 20_000), "files": (10_000, 2_000), "idle_s": (120.0, 20.0), "repeats": (2, 1)}
FONT = Path("/usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--parts", default=",".join(PARTS), help=f"what to measure among {', '.join(PARTS)} (default all)")
    parser.add_argument("--quick", action="store_true", help="the quick sizes: 20,000 vectors, 2,000 files, 20 s idle, 1 OCR round")
    parser.add_argument("--photos", type=int, default=3, help="plate photos and invoices each, read by OCR (default 3 of each, plus one 12 MP photo)")
    parser.add_argument("--pages", type=int, default=3, help="scanned PDF pages read by OCR (default 3)")
    parser.add_argument("--n", type=int, default=None, help="synthetic vectors searched for duplicates (default 100,000; --quick 20,000)")
    parser.add_argument("--dim", type=int, default=2048, help="their width (default 2048, the 2B model's)")
    parser.add_argument("--dup-vectors", default="float32,int8",
                        help="stored precisions the duplicates part measures (default float32,int8: what `auto` keeps at 100k)")
    parser.add_argument("--threshold", type=float, default=0.95, help="the duplicates threshold (default 0.95)")
    parser.add_argument("--sample", type=int, default=2000,
                        help="items whose exact neighbours check the duplicates' recall (default 2,000)")
    parser.add_argument("--files", type=int, default=None, help="files the idle watcher watches (default 10,000; --quick 2,000)")
    parser.add_argument("--idle-s", type=float, default=None, help="seconds the idle watcher is watched (default 120; --quick 20)")
    parser.add_argument("--interval-s", type=float, default=5.0, help="the watcher's poll interval (default 5)")
    add_rounds(parser, default=None, shown="2 OCR rounds; --quick 1")


def run(args: argparse.Namespace) -> SuiteRun:
    parts = names(args.parts)
    if unknown := [p for p in parts if p not in PARTS]:
        raise ConfigError(f"--parts {','.join(unknown)}: unknown; choose among {', '.join(PARTS)}")
    size = {key: getattr(args, key) if getattr(args, key) is not None else values[args.quick] for key, values in _SIZES.items()}
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-library-") as tmp:
        tmp = Path(tmp)
        if "ocr" in parts:
            photos = []
            for i in range(args.photos):
                photos.append(plate_photo(tmp / f"car{i}.jpg"))
                photos.append(invoice_image(tmp / f"invoice{i}.png"))
            if photos:  # a 12-megapixel phone photo with a plate in it: decoded, then read at OCR_MAX_PIXELS
                Image.open(photos[0]).resize((4000, 3000)).save(tmp / "phone.jpg", quality=90)
                photos.append(tmp / "phone.jpg")
            pages = [(scanned_pdf(tmp / f"scan{i}.pdf"), 1) for i in range(args.pages)]
            rows.append({"part": "ocr", **ocr_cost(photos, pages, rounds=size["repeats"])})
        for vectors in names(args.dup_vectors) if "duplicates" in parts else ():
            rows.append({"part": "duplicates", **duplicates_cost(tmp / f"dups-{vectors}", n=size["n"], dim=args.dim,
                                                                 vectors=vectors, threshold=args.threshold,
                                                                 sample=args.sample)})
        if "watch" in parts:
            rows.append({"part": "watch", **watch_idle_cpu(tmp / "watched", tmp / "watchcol", n_files=size["files"],
                                                           idle_s=size["idle_s"], interval_s=args.interval_s)})
    params = {"parts": parts, "quick": args.quick, "photos": args.photos, "pages": args.pages, "dim": args.dim,
              "dup_vectors": names(args.dup_vectors), "threshold": args.threshold, "sample": args.sample,
              "interval_s": args.interval_s, **size}
    return SuiteRun(rows, params, "cpu", None, text=_text(rows))


def _text(rows: list[dict]) -> str:
    lines = []
    for row in rows:
        if row["part"] == "ocr":
            per = lambda s: "-" if s is None else f"{s:.3f} s"  # noqa: E731
            lines.append(f"OCR: {per(row['photo_s'])} per photo ({row['n_photos']}), {per(row['page_s'])} per scanned page "
                         f"({row['n_pages']}); engine load {row['engine_load_s']:.2f} s")
        elif row["part"] == "duplicates":
            recall = "-" if row["group_recall"] is None else f"{row['group_recall']:.4%}"
            lines.append(f"duplicates over {row['n']:,} x {row['dim']} {row['vectors']} at {row['threshold']:g}: "
                         f"{row['seconds']:.2f} s ({row['cpu_s']:.2f} CPU s), {row['groups']} groups, "
                         f"{row['redundant']} redundant; group recall {recall} of {row['true_pairs']} exact pairs "
                         f"of {row['sample']} sampled items, {_share(row['planted_recall'])} of "
                         f"{row['planted_pairs']} planted pairs >= the threshold")
        else:
            lines.append(f"idle watcher over {row['n_files']:,} files, poll every {row['interval_s']:g} s: "
                         f"{row['idle_cpu_s']:.2f} CPU s in {row['idle_wall_s']:.1f} s ({row['cpu_share']:.2%}); "
                         f"one idle poll {row['idle_poll_cpu_s']:.3f} CPU s")
    return "\n".join(lines)


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.4%}"


def _font(size: int):
    return ImageFont.truetype(str(FONT), size) if FONT.exists() else ImageFont.load_default(size=size)


def plate_photo(path: Path) -> Path:
    """A car-ish scene with a white number plate reading RE16 TGK."""
    image = Image.new("RGB", (720, 360), (70, 90, 120))
    draw = ImageDraw.Draw(image)
    draw.rounded_rectangle((60, 80, 660, 330), 40, fill=(150, 20, 30))  # the car
    draw.rectangle((170, 190, 550, 280), fill="white", outline="black", width=4)
    draw.text((190, 198), "RE16 TGK", fill="black", font=_font(64))
    image.save(path, quality=92)
    return path


def invoice_image(path: Path) -> Path:
    """An invoice reading INVOICE, No. 2024-0815, Total 349.00 EUR."""
    image = Image.new("RGB", (640, 420), "white")
    draw = ImageDraw.Draw(image)
    draw.text((40, 40), "INVOICE", fill="black", font=_font(48))
    draw.text((40, 130), "No. 2024-0815", fill="black", font=_font(40))
    draw.text((40, 220), "Total 349.00 EUR", fill="black", font=_font(36))
    image.save(path)
    return path


def scanned_pdf(path: Path) -> Path:
    """A one-page PDF holding only a picture of text (a scan: no text layer)."""
    page = Image.new("RGB", (850, 1100), (250, 248, 240))
    draw = ImageDraw.Draw(page)
    draw.text((80, 120), "LEASE AGREEMENT", fill="black", font=_font(56))
    draw.text((80, 260), "Account 7731", fill="black", font=_font(48))
    page.save(path, "PDF", resolution=100)
    return path


def ocr_cost(photos: Sequence[Path], pages: Sequence[tuple[Path, int]], rounds: int = 2) -> dict[str, Any]:
    """Seconds per photo and per PDF page to read their text (decode at OCR_MAX_PIXELS + RapidOCR),
    the engine loaded before timing (its load is reported apart); the median over `rounds`."""
    from faste_mm.indexers import ItemRecord
    from faste_mm.retrieval.library.ocr import OcrEngine, read_item_image

    engine = OcrEngine()
    started = time.perf_counter()
    engine.read(_blank())
    load_s = time.perf_counter() - started

    def per_item(records: list[ItemRecord]) -> float:
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for record in records:
                engine.read(read_item_image(record))
            times.append((time.perf_counter() - t0) / max(len(records), 1))
        return float(np.median(times))

    photo_records = [ItemRecord(uri=str(Path(p).resolve()), modality="image") for p in photos]
    page_records = [ItemRecord(uri=str(Path(p).resolve()), modality="page", page=n) for p, n in pages]
    return {"engine_load_s": load_s, "photo_s": per_item(photo_records) if photos else None,
            "page_s": per_item(page_records) if pages else None, "n_photos": len(photos), "n_pages": len(pages),
            "rounds": rounds}


def _blank():
    return Image.new("RGB", (64, 64), "white")


def _synthetic(dim: int):
    """The profile of a collection of synthetic vectors (no model: nothing is ever embedded)."""
    from faste_mm.retrieval.profile import CollectionProfile

    return CollectionProfile(model_id="bench/synthetic", dim=dim, model_dim=dim, r_max=0.0)


def duplicate_vectors(n: int, dim: int, share_duplicated: float = 0.05, background_cosine: float = 0.3,
                      max_noise: float = 0.45, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """`n` synthetic unit vectors [n, dim] float32 shaped like a photo library's: unrelated photos
    score ~`background_cosine` with each other (a shared direction, as real embeddings have), and a
    `share_duplicated` of them are near copies of another row (a copy of a copy: bursts) whose
    cosines to it spread from 1 down to ~1 / sqrt(1 + max_noise^2) (0.91), many near 0.95.
    Returns the vectors and the planted pairs [m, 2] (copy row, its source row)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, dim), dtype=np.float32)
    copies = np.sort(rng.choice(n, int(n * share_duplicated), replace=False))
    sources = rng.integers(0, n, len(copies))
    for start in range(0, len(copies), 4096):  # in row order: a copy of an earlier copy is a burst
        rows, src = copies[start:start + 4096], sources[start:start + 4096]
        scale = rng.uniform(0.0, max_noise, (len(rows), 1)).astype(np.float32)
        x[rows] = x[src] + scale * rng.standard_normal((len(rows), dim), dtype=np.float32)
    shared = rng.standard_normal(dim).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    x += np.sqrt(background_cosine / (1 - background_cosine)) * shared / np.linalg.norm(shared)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    planted = np.stack([copies, sources], axis=1)
    return x, planted[planted[:, 0] != planted[:, 1]]


def duplicates_cost(root: Path, n: int = 100_000, dim: int = 2048, vectors: str = "float32",
                    threshold: float = 0.95, sample: int = 2_000, seed: int = 0) -> dict[str, Any]:
    """Seconds (wall and CPU) of `find_duplicates` over a collection of `n` `duplicate_vectors` of
    width `dim` stored as `vectors` (float32 or int8), and its recall against an exact scan: for
    `sample` random items, every item scoring >= threshold with them by the stored vectors (a
    brute-force product with all n), the share the report puts in the same group ("group recall");
    and of the planted near copies whose stored vectors score >= threshold with their source (most
    pairs near the threshold, where a sketch misses first), the share put in one group ("planted
    recall").
    The collection is written before timing;
    `find_duplicates` reads the stored vectors, never the FAISS index, so the index built here is
    a flat one (cheap to write) whatever `auto` would pick."""
    from faste_mm.indexers import Collection, ItemRecord
    from faste_mm.retrieval.library.duplicates import find_duplicates
    from faste_mm.retrieval.library.near_pairs import SCAN_BITS, SKETCH_BITS

    x, planted = duplicate_vectors(n, dim, seed=seed)
    flat = {"float32": "Flat", "float16": "SQfp16", "int8": "SQ8", "binary": "BFlat"}[vectors]
    with Collection.create(root, _synthetic(dim).to_manifest(flat).replace(vectors=vectors)) as col:
        for start in range(0, n, 10_000):
            col.add(x[start:start + 10_000], [ItemRecord(uri=f"/bench/{i:07d}.jpg", modality="image")
                                              for i in range(start, min(start + 10_000, n))])
    del x
    with Collection.open(root) as col:
        wall0, cpu0 = time.perf_counter(), time.process_time()
        report = find_duplicates(col, threshold)
        seconds, cpu_s = time.perf_counter() - wall0, time.process_time() - cpu0
        id_of_row = {int(r.uri[7:14]): r.id for chunk, _ in col.iter_live(10_000) for r in chunk}
        ids = np.array(sorted(id_of_row.values()), dtype=np.int64)
        pairs = np.vectorize(id_of_row.get, otypes=[np.int64])(planted)
        scores = np.einsum("ij,ij->i", col.vectors(pairs[:, 0]), col.vectors(pairs[:, 1]))
        planted_true = [(int(a), int(b)) for (a, b), s in zip(pairs, scores) if s >= threshold]
        picked = np.random.default_rng(seed + 1).choice(ids, min(sample, len(ids)), replace=False)
        truth = _exact_neighbours(col, ids, picked, threshold)
    group_of = {item.id: g for g, group in enumerate(report.groups) for item in group.items}
    # reported pairs are exact scores >= threshold, so a report's group never joins what the exact
    # scan would keep apart: the recall below is the whole error
    def together(pairs: list[tuple[int, int]]) -> int:
        return sum(1 for a, b in pairs if a in group_of and group_of[a] == group_of.get(b))

    same_group = together(truth)
    return {"n": n, "dim": dim, "vectors": vectors, "threshold": threshold, "seconds": seconds, "cpu_s": cpu_s,
            "groups": len(report.groups), "redundant": report.n_redundant, "sketch_bits": SKETCH_BITS,
            "scan_bits": SCAN_BITS, "sample": len(picked), "true_pairs": len(truth),
            "group_recall": same_group / len(truth) if truth else None, "planted_pairs": len(planted_true),
            "planted_recall": together(planted_true) / len(planted_true) if planted_true else None}


def _exact_neighbours(col, ids: np.ndarray, picked: np.ndarray, threshold: float) -> list[tuple[int, int]]:
    """(picked id, other id) for every other live item whose stored vector scores >= threshold with
    a picked one: a brute-force product of the picked vectors with every stored vector."""
    queries = col.vectors(picked)
    pairs = []
    for start in range(0, len(ids), 8192):
        block = ids[start:start + 8192]
        rows, cols = np.nonzero(queries @ col.vectors(block).T >= threshold)
        pairs += [(int(picked[r]), int(block[c])) for r, c in zip(rows, cols) if picked[r] != block[c]]
    return pairs


def watch_idle_cpu(folder: Path, root: Path, n_files: int = 10_000, idle_s: float = 120.0,
                   interval_s: float = 5.0) -> dict[str, Any]:
    """CPU seconds a `FolderWatcher` spends over `idle_s` of wall time watching `n_files` files that
    are all indexed already (a collection of synthetic vectors matching the folder: no model loads),
    polling every `interval_s`; and the CPU of one idle poll."""
    from faste_mm.indexers import Collection, FileStat, ItemRecord
    from faste_mm.retrieval.retriever import Retriever
    from faste_mm.retrieval.library.watching import FolderWatcher, WatchOptions

    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n_files):
        sub = folder / f"{i // 500:03d}"
        sub.mkdir(exist_ok=True)
        (sub / f"{i:06d}.jpg").write_bytes(b"\xff\xd8" + i.to_bytes(4, "little"))
    dim = 8
    with Collection.create(root, _synthetic(dim).to_manifest()) as col:
        stats = [FileStat.of(p) for p in sorted(folder.rglob("*.jpg"))]
        vectors = np.eye(dim, dtype=np.float32)[np.arange(len(stats)) % dim]
        col.add(vectors, [ItemRecord(uri=s.uri, modality="image", size=s.size, mtime=s.mtime) for s in stats])
    watcher = FolderWatcher(Retriever.for_collection(root), [folder], WatchOptions(interval_s=interval_s))
    first = watcher.sync_once()  # opens the collection once: everything unchanged
    assert first.index is not None and first.index.embedded == 0, first
    cpu0 = time.process_time()
    watcher.sync_once()
    poll_cpu_s = time.process_time() - cpu0
    stop = threading.Event()
    thread = threading.Thread(target=watcher.run, args=(stop,), daemon=True)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    thread.start()
    stop.wait(idle_s)
    stop.set()
    thread.join()
    cpu_s, wall_s = time.process_time() - cpu0, time.perf_counter() - wall0
    return {"n_files": n_files, "interval_s": interval_s, "idle_wall_s": wall_s, "idle_cpu_s": cpu_s,
            "cpu_share": cpu_s / wall_s, "idle_poll_cpu_s": poll_cpu_s, "polls": watcher.polls,
            "pid": os.getpid()}

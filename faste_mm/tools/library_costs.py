"""What the photo-library features cost, as callables a bench run calls (no model weights needed):
OCR seconds per photo and per scanned page, duplicates over N synthetic vectors, and the CPU an idle
folder watcher spends. Each returns a plain dict of figures; `scripts/bench_library.py` runs them
and writes the JSON with the machine's description. Never imported by the library itself.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np


def ocr_cost(photos: Sequence[Path], pages: Sequence[tuple[Path, int]], rounds: int = 2) -> dict[str, Any]:
    """Seconds per photo and per PDF page to read their text (decode at OCR_MAX_PIXELS + RapidOCR),
    the engine loaded before timing (its load is reported apart); the median over `rounds`."""
    from faste_mm.indexers import ItemRecord
    from faste_mm.retrieval.ocr import OcrEngine, read_item_image

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
    from PIL import Image

    return Image.new("RGB", (64, 64), "white")


def _synthetic(dim: int):
    """The profile of a collection of synthetic vectors (no model: nothing is ever embedded)."""
    from faste_mm.retrieval.profile import CollectionProfile

    return CollectionProfile(model_id="bench/synthetic", dim=dim, model_dim=dim, r_max=0.0)


def duplicates_cost(root: Path, n: int = 100_000, dim: int = 256, index_type: str = "auto",
                    share_duplicated: float = 0.05, threshold: float = 0.95, seed: int = 0) -> dict[str, Any]:
    """Seconds of `find_duplicates` over a collection of `n` synthetic unit vectors of width `dim`, a
    `share_duplicated` of them near copies (noise 0.01) of another; the index is built before timing."""
    from faste_mm.indexers import Collection, ItemRecord
    from faste_mm.retrieval.duplicates import find_duplicates

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, dim)).astype(np.float32)
    copies = rng.choice(n, int(n * share_duplicated), replace=False)
    x[copies] = x[rng.integers(0, n, len(copies))] + rng.normal(scale=0.05, size=(len(copies), dim)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    with Collection.create(root, _synthetic(dim).to_manifest(index_type)) as col:
        for start in range(0, n, 10_000):
            col.add(x[start:start + 10_000], [ItemRecord(uri=f"/bench/{i:07d}.jpg", modality="image")
                                              for i in range(start, min(start + 10_000, n))])
    with Collection.open(root) as col:
        t0 = time.perf_counter()
        col.range_search(x[:1], threshold)  # builds or loads the index (not timed below)
        index_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        report = find_duplicates(col, threshold)
        seconds = time.perf_counter() - t0
        factory = col.info().index_factory
    return {"n": n, "dim": dim, "index": factory, "index_load_s": index_s, "seconds": seconds,
            "groups": len(report.groups), "redundant": report.n_redundant, "threshold": threshold}


def watch_idle_cpu(folder: Path, root: Path, n_files: int = 10_000, idle_s: float = 120.0,
                   interval_s: float = 5.0) -> dict[str, Any]:
    """CPU seconds a `FolderWatcher` spends over `idle_s` of wall time watching `n_files` files that
    are all indexed already (a collection of synthetic vectors matching the folder: no model loads),
    polling every `interval_s`; and the CPU of one idle poll."""
    from faste_mm.indexers import Collection, FileStat, ItemRecord
    from faste_mm.retrieval.retriever import Retriever
    from faste_mm.retrieval.watching import FolderWatcher, WatchOptions

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

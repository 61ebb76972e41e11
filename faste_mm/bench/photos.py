"""What the photo features cost, in mirrored rounds in one process: reading one photo's facts
(EXIF, XMP, IPTC, place) against hashing it (what every scan already does), and a date-range
search against the unfiltered one on one collection of random vectors taken over 2015-2024.

    faste-mm bench photos --photos 40 --n 100000 --dim 512 --out docs/bench/photos-cpu.json
"""

from __future__ import annotations

import argparse
import math
import re
import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable

import numpy as np
from PIL import Image

from faste_mm.bench.options import add_rounds
from faste_mm.bench.rounds import mirrored_rounds
from faste_mm.bench.schema import SuiteRun
from faste_mm.errors import ConfigError
from faste_mm.indexers.collection import Collection
from faste_mm.indexers.facts import ItemFacts
from faste_mm.indexers.filters import SearchFilter
from faste_mm.indexers.records import ItemRecord, content_hash
from faste_mm.retrieval.library.photo_metadata import read_facts
from faste_mm.retrieval.profile import CollectionProfile

SHARES = (0.01, 0.1, 0.5)  # the date ranges' shares of the collection


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--photos", type=int, default=40, help="photos read per round (default 40)")
    parser.add_argument("--photo-size", default="4032x3024", help="their pixels, WxH (default 4032x3024, a 12 MP phone photo)")
    parser.add_argument("--n", type=int, default=100_000, help="vectors in the dated collection (default 100,000)")
    parser.add_argument("--dim", type=int, default=512, help="their width (default 512)")
    parser.add_argument("--queries", type=int, default=16, help="queries per search call (default 16)")
    add_rounds(parser, default=7)


def run(args: argparse.Namespace) -> SuiteRun:
    size = re.fullmatch(r"([1-9]\d*)x([1-9]\d*)", args.photo_size.lower())
    if size is None:
        raise ConfigError(f"--photo-size {args.photo_size}: expected WIDTHxHEIGHT in pixels, e.g. 4032x3024")
    if args.photos < 1 or args.n < 1 or args.queries < 1:
        raise ConfigError("--photos, --n and --queries must be at least 1")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-photos-") as tmp:
        paths = write_photos(Path(tmp) / "photos", args.photos, size=(int(size[1]), int(size[2])))
        timed = mirrored_rounds(metadata_contenders(paths), args.repeats)
        mean_bytes = sum(p.stat().st_size for p in paths) / len(paths)
        for name, t in timed.items():
            rows.append({"case": f"per photo: {name}", "ms_median": 1000 * t.median / len(paths),
                         "ms_best": 1000 * t.best / len(paths), "photo_bytes": round(mean_bytes)})
        col = dated_collection(Path(tmp) / "col", args.n, args.dim)
        try:
            queries = np.random.default_rng(1).standard_normal((args.queries, args.dim)).astype(np.float32)
            queries /= np.linalg.norm(queries, axis=1, keepdims=True)
            timed = mirrored_rounds(search_contenders(col, queries, 10, SHARES), args.repeats)
            factory = col.info().index_factory
        finally:
            col.close()
        base = timed["unfiltered"].median
        for name, t in timed.items():
            rows.append({"case": f"search {args.queries} queries, k=10: {name}", "ms_median": 1000 * t.median / args.queries,
                         "over_unfiltered": t.median / base, "n": args.n, "dim": args.dim, "factory": factory})
    text = "\n".join(f"{r['case']}: {r['ms_median']:.3f} ms" + (f" ({r['over_unfiltered']:.2f}x)" if "over_unfiltered" in r
                                                                 else "") for r in rows)
    params = {"photos": args.photos, "photo_size": args.photo_size, "n": args.n, "dim": args.dim,
              "queries": args.queries, "repeats": args.repeats}
    return SuiteRun(rows, params, "cpu", None, text=text)


_XMP = ('<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">'
        '<rdf:Description xmlns:dc="http://purl.org/dc/elements/1.1/" xmlns:xmp="http://ns.adobe.com/xap/1.0/" '
        'xmp:Rating="4"><dc:title><rdf:Alt><rdf:li xml:lang="x-default">Holiday {i}</rdf:li></rdf:Alt></dc:title>'
        '<dc:subject><rdf:Bag><rdf:li>beach</rdf:li><rdf:li>sunset</rdf:li></rdf:Bag></dc:subject>'
        '</rdf:Description></rdf:RDF></x:xmpmeta>')


def write_photos(folder: Path, n: int, size: tuple[int, int] = (4032, 3024), seed: int = 0) -> list[Path]:
    """`n` camera-like JPEGs of `size` pixels: EXIF date and offset, camera, lens, GPS somewhere in
    Europe, orientation, and an XMP packet with a title, keywords and a rating."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (size[1] // 8, size[0] // 8, 3), dtype=np.uint8)
    picture = Image.fromarray(base).resize(size)  # smooth content: a realistic JPEG size
    paths = []
    for i in range(n):
        exif = Image.Exif()
        exif[0x010F], exif[0x0110], exif[0x0112] = "Google", "Pixel 8", 1
        sub = exif.get_ifd(0x8769)
        sub[0x9003] = f"2024:{1 + i % 12:02d}:{1 + i % 28:02d} 12:{i % 60:02d}:00"
        sub[0x9011], sub[0xA434] = "+01:00", "Pixel 8 back camera"
        lat, lon = 36 + rng.random() * 20, rng.random() * 30  # east of Greenwich: EXIF stores unsigned degrees
        exif.get_ifd(0x8825).update({1: "N", 2: (float(int(lat)), float(int(lat % 1 * 60)), 1.5),
                                     3: "E", 4: (float(int(lon)), float(int(lon % 1 * 60)), 1.5)})
        path = folder / f"IMG_{i:04d}.jpg"
        picture.save(path, "JPEG", quality=85, exif=exif, xmp=_XMP.format(i=i).encode())
        paths.append(path)
    return paths


def metadata_contenders(paths: list[Path]) -> dict[str, Callable[[], Any]]:
    """Per photo: its facts read (EXIF, XMP, IPTC, place), against its sha256 (every scan reads the
    whole file for it), each over all `paths` per call."""
    read_facts(paths[0], "image")  # the place table loads once per process (about a second), not per photo
    return {"facts": lambda: [read_facts(p, "image") for p in paths],
            "sha256": lambda: [content_hash(p) for p in paths]}


def dated_collection(root: Path, n: int, dim: int, seed: int = 0) -> Collection:
    """A collection of `n` random unit vectors whose items were taken evenly over 2015-2024."""
    rng = np.random.default_rng(seed)
    start = datetime(2015, 1, 1, tzinfo=timezone.utc).timestamp()
    span = datetime(2025, 1, 1, tzinfo=timezone.utc).timestamp() - start
    col = Collection.create(root, CollectionProfile(model_id="bench", dim=dim, model_dim=dim, r_max=0.0).to_manifest())
    for first in range(0, n, 8192):
        count = min(8192, n - first)
        vectors = rng.standard_normal((count, dim)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        records = [ItemRecord(uri=f"/photos/{first + i:07d}.jpg", modality="image",
                              facts=ItemFacts(taken=start + span * (first + i) / n, taken_source="exif"))
                   for i in range(count)]
        col.add(vectors, records)
    col.save_index()
    return col


def date_range(share: float) -> str:
    """A `taken` condition matching about `share` of `dated_collection`'s items (its last days)."""
    days = max(1, math.ceil(share * 3653))
    return f"taken>={(datetime(2025, 1, 1) - timedelta(days=days)).date().isoformat()}"


def search_contenders(col: Collection, queries: np.ndarray, k: int, shares: tuple[float, ...]) -> dict[str, Callable[[], Any]]:
    """The unfiltered search of `queries`, and the same under a date range of each share."""
    contenders: dict[str, Callable[[], Any]] = {"unfiltered": lambda: col.search(queries, k)}
    for share in shares:
        where = SearchFilter(facts=(date_range(share),))
        contenders[f"{date_range(share)} (~{share:.0%})"] = lambda where=where: col.search(queries, k, where=where)
    return contenders

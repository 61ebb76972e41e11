"""What the photo features cost, as contenders for the bench tool's mirrored rounds (faste_mm.bench
may import this; nothing here times anything): reading one photo's facts against hashing it (what
every scan already does), and a date-range search against the unfiltered one on one collection.
`scripts/bench_photos.py` runs them and writes the bench schema's JSON.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable

import numpy as np
from PIL import Image

from faste_mm.indexers.collection import Collection
from faste_mm.indexers.facts import ItemFacts
from faste_mm.indexers.filters import SearchFilter
from faste_mm.indexers.records import ItemRecord, content_hash
from faste_mm.retrieval.photo_metadata import read_facts
from faste_mm.retrieval.profile import CollectionProfile

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
    read_facts(paths[0], "image", 0.0)  # the place table loads once per process (about a second), not per photo
    return {"facts": lambda: [read_facts(p, "image", 0.0) for p in paths],
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

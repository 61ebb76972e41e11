"""Resized images of files kept across queries. A reranker serializes every candidate page or photo
again for each query; with the tower cache warm its vision features are not recomputed, yet the page
would still be rendered and resized (about 80% of a page pair's preprocessing, docs/benchmarks-log.md)
only to be patched and hashed into the tower cache's key. This keeps `prepare_image`'s result per
file, so a later query over the same candidates starts from the resized image.

Key: the resolved path, the PDF page, the file's device, inode, ctime, mtime (ns) and size, and the
pixel bounds of the resize: a replaced or rewritten file is read again. A stored file checked on its
descriptor (`OpenedFile`) keys on the identity of that descriptor, the file actually read. In-memory images (`Item(image=PIL.Image)`)
have no such identity and are not kept. Bounded by bytes (least recently used out first), shared
by the preprocessing threads (`BytesLRU` is thread-safe).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from PIL import Image

from faste_mm.model.rerank.bytes_lru import BytesLRU
from faste_mm.model.items import Item
from faste_mm.model.opened_files import OpenedFile


class ResizedImages:
    """A bytes-bounded LRU (`BytesLRU`) of resized images keyed by file identity and pixel bounds.

    Example:
        >>> kept = ResizedImages(256 << 20)
        >>> image = kept.get(item, (min_pixels, max_pixels), lambda: serializer.prepare_image(item))
    """

    def __init__(self, max_bytes: int) -> None:
        self._images = BytesLRU(max_bytes)
        self.hits = self.misses = 0  # counters for stats (updated without a lock: approximate under threads)

    def get(self, item: Item, bounds: tuple[int, int], prepare: Callable[[], Image.Image]) -> Image.Image:
        """The item's resized image: kept, or `prepare()`d and kept (its errors pass through)."""
        key = file_identity(item, bounds)
        image = None if key is None else self._images.get(key)
        if image is not None:
            self.hits += 1
            return image
        image = prepare()
        if key is not None:
            self.misses += 1
            self._images.keep(key, image.width * image.height * len(image.getbands()), lambda: image)
        return image

    def clear(self) -> None:
        self._images.clear()

    @property
    def nbytes(self) -> int:
        return self._images.nbytes


def file_identity(item: Item, bounds: tuple[int, int]) -> tuple | None:
    """(path, page, device, inode, ctime_ns, mtime_ns, size, bounds) of a file-backed image or
    page; None for in-memory images and files that cannot be stat'ed (reading them reports the
    error). The inode and ctime are what a replacement changes even when it keeps the size and
    sets the mtime back (a file renamed over it: a new inode; rewritten in place: a new ctime,
    which no user call can set back)."""
    if isinstance(item.image, Image.Image) or item.image is None:
        return None
    page = (item.page or 1) if item.is_pdf else None
    if isinstance(item.image, OpenedFile):  # the file read is the opened one, whatever its path holds now
        return (str(item.image.path), page, *item.image.identity, bounds)
    try:
        path = Path(item.image).resolve()
        stat = path.stat()
    except OSError:
        return None
    return (str(path), page, stat.st_dev, stat.st_ino, stat.st_ctime_ns,
            stat.st_mtime_ns, stat.st_size, bounds)


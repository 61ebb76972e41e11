"""Thumbnails of indexed items for the search page: a small JPEG of an image file, of a
rendered PDF page or of a frame of a video, cached on disk beside the collection
(`<collection>.thumbnails/`).

Receives an item record found by id in the collection (never a path from a request); hands
back the cached JPEG's path. Text items have no thumbnail.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from pathlib import Path

from PIL import Image, ImageOps

from faste_mm.errors import InputError
from faste_mm.model.video import VIDEO_SUFFIXES

log = logging.getLogger(__name__)

THUMBNAIL_PX = 384  # longest side; the grid shows ~200 px tiles, sharp on 2x screens
JPEG_QUALITY = 82
IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff"})


class NoThumbnailError(InputError):
    """The item has no picture (a text item, or its file is gone or unreadable): HTTP 404."""


def default_cache_dir(collection: Path) -> Path:
    """`<parent>/<name>.thumbnails`: beside the collection, not inside it (the collection's own
    directory must hold only its files, or `index --reindex` refuses to erase it)."""
    return collection.parent / f"{collection.name}.thumbnails"


def has_thumbnail(uri: str, page: int | None) -> bool:
    """Whether an item with this uri/page can have a thumbnail (an image file, a PDF page or a
    video)."""
    suffix = Path(uri).suffix.lower()
    return not uri.startswith("item:") and (suffix in IMAGE_SUFFIXES or suffix in VIDEO_SUFFIXES
                                            or (suffix == ".pdf" and page is not None))


def thumbnail(record, cache_dir: Path) -> Path:
    """The cached JPEG of one item record, made on first use. The cache key includes the file's
    size and mtime, so a re-indexed, changed file gets a fresh thumbnail.
    Raises NoThumbnailError for text items and missing or unreadable files."""
    if not has_thumbnail(record.uri, record.page):
        raise NoThumbnailError(f"id {record.id}: a {record.modality} item has no thumbnail")
    key = hashlib.sha256(f"{record.uri}\0{record.page}\0{record.size}\0{record.mtime}".encode()).hexdigest()[:16]
    path = cache_dir / f"{record.id}-{key}.jpg"
    if path.exists():
        return path
    image = _render(record)
    image = ImageOps.exif_transpose(image)
    image.thumbnail((THUMBNAIL_PX, THUMBNAIL_PX), Image.Resampling.LANCZOS)
    if image.mode != "RGB":  # JPEG has no alpha: paste on white, as the model sees it
        background = Image.new("RGB", image.size, (255, 255, 255))
        background.paste(image, mask=image.convert("RGBA").split()[-1])
        image = background
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=cache_dir, suffix=".tmp", delete=False) as tmp:
        image.save(tmp, "JPEG", quality=JPEG_QUALITY, optimize=True)
    os.replace(tmp.name, path)  # atomic: a concurrent reader sees the whole file or none
    return path


def _render(record) -> Image.Image:
    from faste_mm import Item
    from faste_mm.model.items import load_image

    source = Path(record.uri)
    if not source.is_file():
        raise NoThumbnailError(f"id {record.id}: its file {source} is gone; re-index the collection")
    if source.suffix.lower() in VIDEO_SUFFIXES:
        return _video_frame(record.id, source)
    item = Item(image=source, page=record.page if source.suffix.lower() == ".pdf" else None)
    try:
        # PDF pages render near this many pixels: enough for a sharp thumbnail, no more
        return load_image(item, max_pixels=4 * THUMBNAIL_PX * THUMBNAIL_PX)
    except InputError as error:
        raise NoThumbnailError(f"id {record.id}: {error}") from None


VIDEO_FRAME_AT = 0.3  # share of the duration: past a fade-in or a title card, still early


def _video_frame(item_id: int, source: Path) -> Image.Image:
    """The first frame at or after VIDEO_FRAME_AT of the video's duration (the first frame when
    the container states no duration or the seek fails)."""
    import av

    try:
        with av.open(str(source), mode="r") as container:
            if not container.streams.video:
                raise NoThumbnailError(f"id {item_id}: {source} has no video stream")
            stream = container.streams.video[0]
            if container.duration:  # microseconds (av.time_base)
                try:
                    container.seek(int(container.duration * VIDEO_FRAME_AT), backward=True)
                except av.FFmpegError:
                    container.seek(0)
            for frame in container.decode(stream):
                return frame.to_image()
    except av.FFmpegError as error:
        raise NoThumbnailError(f"id {item_id}: {source} is not a readable video ({error})") from None
    raise NoThumbnailError(f"id {item_id}: {source} has no decodable frame")

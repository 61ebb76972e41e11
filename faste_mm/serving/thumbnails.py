"""Thumbnails of indexed items for the search page: a small JPEG of an image file, of a
rendered PDF page or of a frame of a video, cached on disk beside the collection
(`<collection>.thumbnails/`).

Receives an item record found by id in the collection (never a path from a request); hands
back the cached JPEG's bytes. Text items have no thumbnail. The item's file is read only through
the descriptor that `retrieval.stored_files` checked (an `OpenedFile`), never reopened by path;
the cache key is that opened file's identity (device, inode, ctime, size), so a file replaced
since is never served from the cache.

The cache folder is made with mode 0700 and must be a real folder of the server's user; a
cached file is served only if it is a regular file of that user, opened without following
links (O_NOFOLLOW) and checked on the open descriptor. Anything else found under a thumbnail's
name (a link planted to a private file, a stranger's file) is replaced by a fresh thumbnail.
"""

from __future__ import annotations

import errno
import hashlib
import io
import logging
import os
import stat
import tempfile
from pathlib import Path

from PIL import Image, ImageOps

from faste_mm.errors import FasteError, InputError
from faste_mm.kinds import KINDS, kind_name
from faste_mm.model.opened_files import OpenedFile
from faste_mm.retrieval.stored_files import GoneFileError, stored_file

log = logging.getLogger(__name__)

THUMBNAIL_PX = 384  # longest side; the grid shows ~200 px tiles, sharp on 2x screens
JPEG_QUALITY = 82


class NoThumbnailError(InputError):
    """The item has no picture (a text item, or its file is gone or unreadable): HTTP 404."""


class ThumbnailCacheError(FasteError):
    """The cache folder is not the server's own (a link, a file, another user's): HTTP 500."""


def default_cache_dir(collection: Path) -> Path:
    """`<parent>/<name>.thumbnails`: beside the collection, not inside it (the collection's own
    directory must hold only its files, or `index --reindex` refuses to erase it)."""
    return collection.parent / f"{collection.name}.thumbnails"


def has_thumbnail(uri: str, page: int | None) -> bool:
    """Whether an item with this uri/page can have a thumbnail: its kind's thumbnail rule
    (`faste_mm.kinds`: an image file, a frame of a video, or a PDF's page)."""
    kind = KINDS.get(kind_name(uri))
    rule = None if uri.startswith("item:") or kind is None else kind.thumbnail
    return rule in ("image", "frame") or (rule == "page" and page is not None)


def thumbnail(record, cache_dir: Path) -> bytes:
    """The cached JPEG of one item record, made on first use. The cache key includes the checked
    file's device, inode, ctime and size, so a changed or replaced file gets a fresh thumbnail.
    Raises NoThumbnailError for text items and missing or unreadable files, ThumbnailCacheError
    when `cache_dir` is not a folder of this user."""
    if not has_thumbnail(record.uri, record.page):
        raise NoThumbnailError(f"id {record.id}: a {record.modality} item has no thumbnail")
    source = stored_file(record)  # a cached thumbnail is served only while the file is the one indexed
    key = hashlib.sha256("\0".join(map(str, (record.uri, record.page, *source.identity))).encode()).hexdigest()[:16]
    _own_folder(cache_dir)
    path = cache_dir / f"{record.id}-{key}.jpg"
    cached = _read_own_file(path)
    if cached is not None:
        return cached
    encoded = jpeg(_render(record, source), THUMBNAIL_PX)
    with tempfile.NamedTemporaryFile(dir=cache_dir, suffix=".tmp", delete=False) as tmp:  # O_EXCL, 0600
        tmp.write(encoded)
    # Atomic: a concurrent reader sees the whole file or none; a link planted under the name is
    # replaced itself (rename never writes through a link).
    os.replace(tmp.name, path)
    return encoded


def preview(record, longest_px: int) -> bytes:
    """A JPEG of one item record at most `longest_px` on its longest side, rendered now and not
    cached (an assistant's larger look at one item: `faste_mm.serving.mcp_tools` get_item).
    A PDF page is rendered near that size. Raises NoThumbnailError as `thumbnail` does."""
    if not has_thumbnail(record.uri, record.page):
        raise NoThumbnailError(f"id {record.id}: a {record.modality} item has no picture")
    try:  # only the file that was indexed (a link planted since is refused: retrieval.stored_files)
        source = stored_file(record)
    except GoneFileError as error:
        raise NoThumbnailError(str(error)) from None
    return jpeg(_render(record, source, longest_px), longest_px)


def jpeg(image: Image.Image, longest_px: int) -> bytes:
    """`image` upright (EXIF orientation), shrunk to at most `longest_px` a side, on white, as JPEG."""
    image = ImageOps.exif_transpose(image)
    image.thumbnail((longest_px, longest_px), Image.Resampling.LANCZOS)
    if image.mode != "RGB":  # JPEG has no alpha: paste on white, as the model sees it
        background = Image.new("RGB", image.size, (255, 255, 255))
        background.paste(image, mask=image.convert("RGBA").split()[-1])
        image = background
    encoded = io.BytesIO()
    image.save(encoded, "JPEG", quality=JPEG_QUALITY, optimize=True)
    return encoded.getvalue()


def _own_folder(cache_dir: Path) -> None:
    """Make `cache_dir` (mode 0700) or check that it is a real folder of this user."""
    try:
        cache_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(cache_dir)
    except OSError as error:
        raise ThumbnailCacheError(f"{cache_dir}: cannot make the thumbnail cache ({error.strerror}); give "
                                  f"--thumbnail-dir a folder this server may write") from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise ThumbnailCacheError(f"{cache_dir}: the thumbnail cache is not a folder of this user (a link, a "
                                  f"file or someone else's); remove it and it is made again")


def _read_own_file(path: Path) -> bytes | None:
    """The bytes of `path` if it is a regular file of this user (opened without following a
    link, checked on the descriptor); None when it is absent or anything else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as error:
        if error.errno not in (errno.ENOENT, errno.ELOOP):
            log.warning("%s: cannot read the cached thumbnail (%s); making it again", path, error.strerror)
        elif error.errno == errno.ELOOP:
            log.warning("%s: a link where a thumbnail belongs; replacing it", path)
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            log.warning("%s: not a thumbnail this server wrote; replacing it", path)
            return None
        return f.read()


def _render(record, source: OpenedFile, longest_px: int = THUMBNAIL_PX) -> Image.Image:
    """The item's picture, decoded from `source` (its checked descriptor)."""
    from faste_mm import Item
    from faste_mm.model.file_decoding import load_image

    rule = KINDS[kind_name(record.uri)].thumbnail
    if rule == "frame":
        return _video_frame(record.id, source)
    item = Item(image=source, page=record.page if rule == "page" else None)
    try:
        # PDF pages render near this many pixels: enough for a sharp thumbnail, no more
        return load_image(item, max_pixels=4 * longest_px * longest_px)
    except InputError as error:
        raise NoThumbnailError(f"id {record.id}: {error}") from None


VIDEO_FRAME_AT = 0.3  # share of the duration: past a fade-in or a title card, still early


def _video_frame(item_id: int, source: OpenedFile) -> Image.Image:
    """The first frame at or after VIDEO_FRAME_AT of the video's duration (the first frame when
    the container states no duration or the seek fails)."""
    import av

    try:
        with av.open(source.reader(), mode="r") as container:
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

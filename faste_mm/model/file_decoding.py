"""Reading an item's file: images through Pillow (the optional plugins of `kinds.PLUGINS`, such as
HEIC, registered once; the decompression-bomb guards: a huge JPEG decoded at reduced scale, any other
format past `MAX_DECODE_PIXELS` refused from its header), PDFs through PDFium under one lock (page
count, a page's rendered size, its rendering, its text layer), and the checks every read makes first
(a regular, non-empty file).

Receives `Item`s (model/items.py), paths or `OpenedFile`s; hands back PIL images not yet resized,
sizes, page counts and text; what cannot be read raises InputError naming the file and what to do.
"""

from __future__ import annotations

import errno
import importlib
import math
import os
import re
import stat
import threading
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from PIL import Image, UnidentifiedImageError

from faste_mm.errors import InputError
from faste_mm.kinds import PLUGINS
from faste_mm.model.opened_files import OpenedFile, decoder_input, file_name

if TYPE_CHECKING:  # items imports this module (a PDF path expands to its pages)
    from faste_mm.model.items import Item

# Images above this many pixels (8192 x 8192, 256 MiB as RGBA) are never decoded whole: a JPEG
# is decoded at 1/2, 1/4 or 1/8 scale by its DCT (`draft`), anything else is refused by its
# header, so a decompression bomb costs no memory. The model sees at most max_pixels anyway.
MAX_DECODE_PIXELS = 8192 * 8192
# Pillow warns (DecompressionBombWarning) on opening images past its own limit, before we can
# look at the header; `_decodable` handles those images, so the warning would only repeat us.
warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)


def count_pdf_pages(source: Path | OpenedFile) -> int:
    """Number of pages; raises InputError for missing, empty, encrypted or broken PDFs."""
    with _open_pdf(source) as pdf:
        n_pages = len(pdf)
    if n_pages == 0:
        raise InputError(f"{file_name(source)}: the PDF has no pages")
    return n_pages


def load_image(item: Item, max_pixels: int) -> Image.Image:
    """Decode the item's image (or render its PDF page) as a PIL image, not yet resized.

    PDF pages are rendered at the scale that brings the page close to `max_pixels`, so no
    detail is rendered only to be thrown away by the later resize.
    """
    image = item.image
    if isinstance(image, Image.Image):
        return image
    path = file_name(image)
    if item.is_pdf:
        return _render_pdf_page(image, item.page or 1, max_pixels)
    with _open_image(image, "image data is truncated or corrupt") as opened:
        _decodable(opened, path)
        opened.load()
        return opened.copy() if opened.mode != "P" else opened.convert("RGBA")


_plugins_lock = threading.Lock()
_plugins_tried: set[str] = set()


def register_image_plugins() -> None:
    """Register the Pillow plugins of `kinds.PLUGINS` that are installed (once per process; a missing
    one is reported by `_open_image` when a file needs it)."""
    with _plugins_lock:
        for plugin in PLUGINS:
            if plugin.register is None or plugin.module in _plugins_tried:
                continue
            _plugins_tried.add(plugin.module)
            try:
                module = importlib.import_module(plugin.module)
            except ImportError:
                continue
            getattr(module, plugin.register)()


def missing_plugin(path: Path) -> str | None:
    """What to install to read `path`'s kind of image (a HEIC without pillow-heif, an AVIF without
    Pillow's AVIF support), or None when nothing is missing."""
    suffix = path.suffix.lower()
    for plugin in PLUGINS:
        if suffix not in plugin.suffixes:
            continue
        if plugin.feature is not None:
            from PIL import features

            if not features.check(plugin.feature):
                return f"{suffix[1:].upper()} images need a Pillow built with {plugin.feature}: {plugin.extra}"
        elif not _importable(plugin.module):
            return f"{suffix[1:].upper()} photos need the {plugin.module} plugin: {plugin.extra}"
    return None


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def read_image_size(item: Item) -> tuple[int, int]:
    """(width, height) of the item's image as `load_image` would decode it, read from the file
    header only: PIL opens lazily, so no pixel data is decoded. Not for PDF pages, whose pixel
    size is chosen by the renderer.
    """
    image = item.image
    if isinstance(image, Image.Image):
        return image.size
    path = file_name(image)
    with _open_image(image, "image header is unreadable") as opened:
        _decodable(opened, path)
        return opened.size


def _decodable(opened: Image.Image, path: Path) -> None:
    """Bring an opened (not yet decoded) image within MAX_DECODE_PIXELS: a JPEG's decoder is set
    to a reduced scale (`opened.size` becomes the size it will decode to), anything else above
    the limit raises InputError. `load_image` and `read_image_size` both call this, so the
    planned and the decoded size agree."""
    width, height = opened.size
    if width * height <= MAX_DECODE_PIXELS:
        return
    if opened.format == "JPEG":
        # draft() picks the strongest reduction (1/2, 1/4, 1/8) that stays at or above the size
        # asked for, so ask for the size at the power-of-two scale that fits the limit.
        scale = 2 ** math.ceil(math.log2(math.sqrt(width * height / MAX_DECODE_PIXELS)))
        opened.draft(opened.mode, (math.ceil(width / scale), math.ceil(height / scale)))
        if opened.size[0] * opened.size[1] <= MAX_DECODE_PIXELS:
            return
    raise InputError(f"{path}: image is {width}x{height} = {width * height / 1e6:.0f} megapixels, more than "
                     f"faste-mm decodes ({MAX_DECODE_PIXELS / 1e6:.0f} megapixels); downscale it first "
                     f"(the model sees at most max_pixels anyway)")


@contextmanager
def _open_image(source: Path | OpenedFile, unreadable: str):
    """PIL's lazy open (of the path, or of an `OpenedFile`'s own descriptor), its errors (also
    those of reading inside the block) turned into InputErrors naming the file; `unreadable`
    says what an OSError means here."""
    path = file_name(source)
    _check_file(source)
    register_image_plugins()
    try:
        with open_lazily(decoder_input(source)) as opened:
            yield opened
    except UnidentifiedImageError:
        missing = missing_plugin(path)
        if missing is not None:
            raise InputError(f"{path}: cannot read it: {missing}") from None
        raise InputError(f"{path}: not a readable image (unknown or corrupt format); fix or remove the file") from None
    except Image.DecompressionBombError as error:
        raise InputError(f"{path}: image too large to decode safely ({error}); downscale it first "
                         f"(the model sees at most max_pixels anyway)") from None
    except OSError as error:
        raise InputError(f"{path}: {unreadable} ({error}); re-export the file") from None


def open_lazily(given: str | BinaryIO) -> Image.Image:
    """PIL's lazy open of `given` (a path string or a binary reader): the header read, no pixel
    decoded. A JPEG past Pillow's decompression-bomb limit (179 MP) is opened by its JPEG plugin
    directly rather than refused, for `_decodable` to set its reduced scale (the DCT decodes it at
    1/2, 1/4 or 1/8 without ever holding the full size; docs/photos.md: JPEGs over 67 MP are decoded
    at reduced scale); any other format past the limit stays refused from its header
    (Image.DecompressionBombError)."""
    try:
        return Image.open(given)
    except Image.DecompressionBombError:
        if isinstance(given, str):
            with open(given, "rb") as f:
                is_jpeg = f.read(3) == _JPEG_MAGIC
        else:
            given.seek(0)
            is_jpeg = given.read(3) == _JPEG_MAGIC
            given.seek(0)
        if not is_jpeg:
            raise
        from PIL import JpegImagePlugin

        return JpegImagePlugin.JpegImageFile(given)


_JPEG_MAGIC = b"\xff\xd8\xff"  # SOI and the next marker's first byte


def not_a_file_reason(path: Path) -> str | None:
    """Why `path` cannot be read as a file (missing, a dangling or looping symlink, a folder, a
    FIFO, a socket or device), in words with what to do; None for a regular file."""
    try:
        mode = os.stat(path).st_mode
    except OSError as error:
        if not os.path.lexists(path):
            return f"{path}: file not found; check the path"
        if error.errno == errno.ELOOP:
            return f"{path}: symbolic link loop (the link points back to itself); fix or remove the link"
        if error.errno == errno.ENOENT:
            return (f"{path}: broken symbolic link (its target {os.readlink(path)} does not exist); "
                    f"fix or remove the link")
        return f"{path}: cannot read the file ({error.strerror}); check its permissions"
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return f"{path}: is a folder, not a file; index the folder to index the files in it"
    kind = "a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
    return f"{path}: is {kind}, not a regular file; only regular files are read, remove or exclude it"


def _check_file(source: str | Path | OpenedFile) -> None:
    if isinstance(source, OpenedFile):  # checked when opened (a regular file); its size is the opened file's
        if source.size == 0:
            raise InputError(f"{source.path}: file is empty (0 bytes); remove it or re-export it")
        return
    path = Path(source)
    reason = not_a_file_reason(path)
    if reason is not None:
        raise InputError(reason)
    if path.stat().st_size == 0:
        raise InputError(f"{path}: file is empty (0 bytes); remove it or re-export it")


# PDFium is not thread-safe, not even across documents: concurrent calls crash or corrupt the
# process. The preprocessing workers are threads, so every use of it holds this one lock.
_PDFIUM_LOCK = threading.Lock()


@contextmanager
def _open_pdf(source: Path | OpenedFile):
    """An open pypdfium2 document (of the path, or read through an `OpenedFile`'s descriptor),
    with its errors turned into InputError naming the file; holds `_PDFIUM_LOCK` from opening
    to closing."""
    import pypdfium2 as pdfium

    path = file_name(source)
    _check_file(source)
    with _PDFIUM_LOCK:
        try:
            pdf = _pdfium_document(source)
        except pdfium.PdfiumError as error:
            reason = str(error)
            if "password" in reason.lower():
                raise InputError(f"{path}: the PDF is encrypted; decrypt it (e.g. qpdf --decrypt) or skip it") from None
            if _has_empty_page_tree(source):  # PDFium refuses these with a stale or misleading error
                raise InputError(f"{path}: the PDF has no pages (or no readable page tree); re-export "
                                 f"it from its source or remove it") from None
            raise InputError(f"{path}: not a readable PDF ({reason}); repair or re-export it") from None
        try:
            yield pdf
        finally:
            pdf.close()


def _pdfium_document(source: Path | OpenedFile):
    """PDFium's document for `source`; only `_open_pdf` calls it, under `_PDFIUM_LOCK`. One named
    call for the library's constructor, so a test can watch every opening hold the lock."""
    import pypdfium2 as pdfium

    return pdfium.PdfDocument(decoder_input(source))


def _has_empty_page_tree(source: Path | OpenedFile, limit: int = 1 << 20) -> bool:
    """True when the file's first `limit` bytes hold a page tree whose every /Count is 0 (a
    valid PDF without pages, which PDFium fails to load with no useful reason)."""
    with source.reader() if isinstance(source, OpenedFile) else open(source, "rb") as f:
        data = f.read(limit)
    counts = re.findall(rb"/Count\s*(\d+)", data)
    return data.startswith(b"%PDF") and b"/Pages" in data and bool(counts) and all(int(c) == 0 for c in counts)


def pdf_page_size(item: Item, max_pixels: int) -> tuple[int, int]:
    """(width, height) in pixels of the item's PDF page as `load_image` renders it, from the
    page box alone (nothing is rendered), so a long PDF can be planned into batches before
    any of its pages takes memory."""
    path = file_name(item.image)
    with _open_pdf(item.image) as pdf:
        width_pt, height_pt = _pdf_page(pdf, path, item.page or 1).get_size()
    scale = _render_scale(width_pt, height_pt, max_pixels)
    # pypdfium2's render sizes its bitmap as ceil(points * scale) on each side
    return math.ceil(width_pt * scale), math.ceil(height_pt * scale)


def _pdf_page(pdf, path: Path, page: int):
    if page > len(pdf):
        raise InputError(f"{path}: page {page} requested but the PDF has {len(pdf)} pages")
    return pdf[page - 1]


def _render_scale(width_pt: float, height_pt: float, max_pixels: int) -> float:
    """Points to pixels: the page comes out close to `max_pixels` (at most 8x, 576 dpi)."""
    return min(math.sqrt(max_pixels / max(width_pt * height_pt, 1.0)), 8.0)


def pdf_page_text(source: str | Path | OpenedFile, page: int) -> str:
    """The text layer of a PDF page (1-based), "" for a scanned page without one; InputError
    naming the file when the PDF cannot be read or has fewer pages."""
    source = source if isinstance(source, OpenedFile) else Path(source)
    path = file_name(source)
    with _open_pdf(source) as pdf:
        if not 1 <= page <= len(pdf):
            raise InputError(f"{path}: page {page} requested but the PDF has {len(pdf)} pages")
        textpage = pdf[page - 1].get_textpage()
        try:
            return textpage.get_text_range()
        finally:
            textpage.close()


def pdf_metadata(source: str | Path | OpenedFile) -> dict[str, str]:
    """The PDF's document information (Title, Author, Subject, Keywords, CreationDate, ...; empty
    values left out), read under the one PDFium lock; InputError naming the file when the PDF
    cannot be read."""
    with _open_pdf(source if isinstance(source, OpenedFile) else Path(source)) as pdf:
        return pdf.get_metadata_dict(skip_empty=True)


def _render_pdf_page(source: Path | OpenedFile, page: int, max_pixels: int) -> Image.Image:
    path = file_name(source)
    with _open_pdf(source) as pdf:
        pdf_page = _pdf_page(pdf, path, page)
        width_pt, height_pt = pdf_page.get_size()
        bitmap = pdf_page.render(scale=_render_scale(width_pt, height_pt, max_pixels))
        return bitmap.to_pil().convert("RGB")  # a copy: the bitmap's memory goes with the PDF

"""A region of a picture as a query (search's `crop`): the picture decoded as the model reads it (an
image file upright, as viewers show it; a PDF's page rendered at the collection's max_pixels, as its
pages were indexed; an indexed item's file only while it is the file that was indexed), the box
checked against the picture's size and cut out. The search executor hands the cut-out to the model
as any query image, so the model's pixel budget applies to it (a small region is upscaled, a large
one shrunk, by the processor's rules). Receives the query's `Item` or an item record and the box
(x, y, width, height); hands back the `Item` of the region, or its size for the page's box.
"""

from __future__ import annotations

from dataclasses import replace

from PIL import ExifTags, Image, ImageOps

from faste_mm.errors import InputError
from faste_mm.kinds import KINDS, UNSUPPORTED, kind_name
from faste_mm.model.file_decoding import load_image, open_lazily, pdf_page_size, read_image_size
from faste_mm.model.items import Item
from faste_mm.model.opened_files import decoder_input
from faste_mm.retrieval.stored_files import stored_item

Box = tuple[int, int, int, int]  # x, y, width, height in pixels, from the picture's top-left corner

# EXIF orientations that turn the picture a quarter (transposed, 90 degrees, transverse, 270
# degrees): its upright width is its stored height.
_QUARTER_TURNS = (5, 6, 7, 8)


def cropped(item: Item, box: Box, max_pixels: int) -> Item:
    """`item` with its picture replaced by the region `box` of it (its text and instruction kept).
    A PDF is cut from its page (page 1 of a PDF given as a file) rendered at `max_pixels`.
    InputError naming crop, the box and the picture's size when the box is not inside the picture,
    or when the item has no picture."""
    if item.image is None:
        raise InputError(f"crop {_shown(box)}: {item.describe()} has no picture to cut a region from; give an image "
                         f"(or a PDF) with the crop")
    page = _page(item)
    picture = load_image(page, max_pixels)
    turned = not page.is_pdf and picture.getexif().get(ExifTags.Base.Orientation, 1) != 1
    if turned:  # upright, as the page's preview and any viewer show it
        picture = ImageOps.exif_transpose(picture)
    _check_inside(box, picture.size, page, turned)
    x, y, width, height = box
    return replace(item, image=picture.crop((x, y, x + width, y + height)), page=None)


def picture_size(item: Item, max_pixels: int) -> tuple[int, int]:
    """(width, height) of the picture `cropped` cuts from, in the pixels a box is given in, read from
    the file's header (a PDF's page box): the size the page scales a box drawn on a preview to."""
    page = _page(item)
    if page.is_pdf:
        return pdf_page_size(page, max_pixels)
    width, height = read_image_size(page)
    return (height, width) if _orientation(page) in _QUARTER_TURNS else (width, height)


def stored_picture(record) -> Item:
    """The picture of an indexed item, read back from its file only while it is the file that was
    indexed (`stored_files`): an image, or a PDF's page. InputError naming the item when it is a
    video or a text (nothing to cut a region from); GoneFileError / ReplacedFileError as for
    thumbnails."""
    kind = kind_name(record.uri)
    if kind == UNSUPPORTED or KINDS[kind].decoder not in ("image", "pdf-pages"):
        what = "an item added from Python (the collection keeps no picture of it)" if kind == UNSUPPORTED \
            else f"a {kind} item"
        raise InputError(f"crop: id {record.id} ({record.uri}) is {what}; a crop cuts a region of an image or a PDF "
                         f"page; search like it without crop (its stored vector)")
    return stored_item(record)


def _page(item: Item) -> Item:
    """A PDF given as a file, its first page (as `like` takes a PDF's path); any other item itself."""
    return replace(item, page=1) if item.is_pdf and item.page is None else item


def _orientation(item: Item) -> int | None:
    """The EXIF orientation of the item's image (header only; None without one)."""
    image = item.image
    if isinstance(image, Image.Image):
        return image.getexif().get(ExifTags.Base.Orientation)
    with open_lazily(decoder_input(image)) as opened:
        return opened.getexif().get(ExifTags.Base.Orientation)


def _check_inside(box: Box, size: tuple[int, int], item: Item, turned: bool) -> None:
    x, y, width, height = box
    picture_width, picture_height = size
    shown = f"{item.describe()} is {picture_width}x{picture_height} pixels" + \
        (" (upright: its EXIF orientation applied)" if turned else " (the page as rendered for the model)"
         if item.is_pdf else "")
    if width > picture_width or height > picture_height:
        raise InputError(f"crop {_shown(box)}: the box ({width}x{height}) is larger than the picture: {shown}; "
                         f"give a box inside it")
    if x + width > picture_width or y + height > picture_height:
        raise InputError(f"crop {_shown(box)}: the box reaches past the picture's edge (its right edge at "
                         f"{x + width}, its bottom at {y + height}): {shown}; give X+W <= {picture_width} and "
                         f"Y+H <= {picture_height}")


def _shown(box: Box) -> str:
    return ",".join(map(str, box))

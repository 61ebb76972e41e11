"""The words an item contributes to the collection's lexical index (`ItemRecord.text`): a text
item's text, the text of an image+text item, the text layer of a PDF page (pypdfium2). File names,
path words and metadata values are indexed by the collection itself. Video subtitles are not read
(decoding a container's subtitle streams costs a demux per video; none is indexed).
"""

from __future__ import annotations

import logging
from pathlib import Path

from faste_mm.errors import InputError
from faste_mm.kinds import is_kind
from faste_mm.model.file_decoding import pdf_page_text
from faste_mm.model.items import Item
from faste_mm.model.opened_files import OpenedFile, file_name

log = logging.getLogger(__name__)

# A page's text layer beyond this many characters adds little to BM25 and bloats the database.
MAX_TEXT_CHARS = 100_000


def item_text(item: Item) -> str | None:
    """The lexical text of one embedded item (see the module docstring); None when it has none."""
    if item.text:
        return item.text[:MAX_TEXT_CHARS]
    if item.page is not None and isinstance(item.image, (str, Path)) and is_kind(item.image, "pdf"):
        return page_text(Path(item.image), item.page)
    return None


def page_text(source: Path | OpenedFile, page: int) -> str | None:
    """A PDF page's text layer (of the path, or of a checked `OpenedFile`), or None (logged) when it
    cannot be read: the page keeps its vector and stays findable by name; a text layer is never a
    reason to fail an item."""
    try:
        return pdf_page_text(source, page)[:MAX_TEXT_CHARS] or None
    except InputError as error:
        log.info("%s: no text layer for page %d (%s)", file_name(source), page, error)
        return None


def source_text(value: object, page: int | None) -> str | None:
    """The lexical text of an indexed file's row: `value` is what scanning read (an Item for a text
    file, else the path), `page` the row's PDF page."""
    if isinstance(value, Item):
        return item_text(value)
    if page is not None and isinstance(value, (str, Path)) and is_kind(value, "pdf"):
        return page_text(Path(value), page)
    return None

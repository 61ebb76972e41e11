"""Decoders: one per input kind (`faste_mm.kinds`, its `decoder` column), turning a file into what
the embedder takes, with the collection's profile (pixel bounds, video settings).

Three uses of the same table: `document_input` hands the plain path's embedder a value it decodes
in its own prefetch threads (a path, or the text of a text file); `decode_file` decodes eagerly
into rows (PIL images, rendered pages, `Item`s), as the Ray executor's CPU tasks do; `query_item`
makes a query of a file. A failure row
carries the reason a plain run's embedder records for the same file.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Callable, Sequence

from faste_mm.errors import FasteError, InputError
from faste_mm.indexers.records import open_regular
from faste_mm.kinds import KINDS
from faste_mm.model.file_decoding import count_pdf_pages, load_image
from faste_mm.model.items import Item, failure_reason

if TYPE_CHECKING:
    from faste_mm.retrieval.profile import CollectionProfile


@dataclass(frozen=True, slots=True)
class Decoded:
    """One row of a decoded file: its page (PDFs) and the embedder input (a PIL image, or an
    `Item` for text and video), or the reason it cannot be embedded."""

    page: int | None
    value: object = None
    reason: str | None = None


# Text past this many bytes is never read: the model sees at most max_length tokens (8192 by
# default), and no tokenizer spends 128 bytes on one token, so memory stays bounded however
# large the file is.
TEXT_READ_BYTES = 1 << 20


def read_text_file(path: Path) -> str:
    """The text of a .txt/.md document (its first TEXT_READ_BYTES; a UTF-8 BOM is dropped);
    InputError for empty or non-UTF-8 files."""
    try:
        with open_regular(path) as f:  # never blocks on a file swapped for a FIFO
            return read_text(f, str(path))
    except OSError as error:
        raise InputError(f"{path}: cannot read the file ({error.strerror or error}); check that it "
                         f"exists and that you may read it") from None


def read_text(f: BinaryIO, name: str) -> str:
    """The text of an open text file (`read_text_file`; `retrieval.stored_files` reads a stored
    one from its checked descriptor). InputError naming `name` for empty or non-UTF-8 files."""
    data = f.read(TEXT_READ_BYTES)
    try:
        # final=False: a character cut at the read limit is dropped, not an error.
        text = codecs.getincrementaldecoder("utf-8-sig")().decode(data, final=len(data) < TEXT_READ_BYTES)
    except UnicodeDecodeError as error:
        raise InputError(f"{name}: not UTF-8 text ({error.reason} at byte {error.start}); "
                         f"convert it to UTF-8 (e.g. iconv -f latin1 -t utf-8)") from None
    if not text.strip():
        raise InputError(f"{name}: file is empty (no text); remove it or add text")
    return text


def _reason(item: Item, error: Exception) -> str:
    """The reason a plain run's embedder records for `item` failing with `error`."""
    return failure_reason(item, error)


def _decode_image(path: Path, profile: "CollectionProfile") -> list[Decoded]:
    item = Item(image=path)
    try:
        return [Decoded(None, load_image(item, profile.max_pixels))]
    except Exception as error:  # one bad file is a failure row, never the run's end
        return [Decoded(None, reason=_reason(item, error))]


def decode_pdf_pages(path: Path, profile: "CollectionProfile", pages: Sequence[int] | None = None) -> list[Decoded]:
    """Every page (or those in `pages`, 1-based) rendered near the collection's max_pixels (as
    the embedder renders them); the Ray executor asks for a long PDF a range at a time."""
    if pages is None:
        try:
            pages = range(1, count_pdf_pages(path) + 1)
        except FasteError as error:  # the reason `expand_items` records for the whole file
            return [Decoded(None, reason=str(error))]
    rows = []
    for page in pages:
        item = Item(image=path, page=page)
        try:
            rows.append(Decoded(page, load_image(item, profile.max_pixels)))
        except Exception as error:
            rows.append(Decoded(page, reason=_reason(item, error)))
    return rows


def _decode_video(path: Path, profile: "CollectionProfile") -> list[Decoded]:
    """A video stays a file: the embedder's serializer samples and resizes its frames with the
    profile's video settings (frames are far larger than the file, so they are not shipped)."""
    return [Decoded(None, Item(video=path))]


def _decode_text(path: Path, profile: "CollectionProfile") -> list[Decoded]:
    try:
        return [Decoded(None, Item(text=read_text_file(path)))]
    except InputError as error:
        return [Decoded(None, reason=str(error))]


# decoder name (faste_mm.kinds.Kind.decoder) -> eager decoder; every kind has one (tested)
DECODERS: dict[str, Callable[[Path, "CollectionProfile"], list[Decoded]]] = {
    "image": _decode_image,
    "pdf-pages": decode_pdf_pages,
    "video": _decode_video,
    "text": _decode_text,
}

# decoder name -> the value the plain path's embedder decodes itself (in its prefetch threads)
DOCUMENT_INPUTS: dict[str, Callable[[Path], object]] = {
    "image": lambda path: path,
    "pdf-pages": lambda path: path,  # expanded into its pages by the embedder
    "video": lambda path: Item(video=path),
    "text": lambda path: Item(text=read_text_file(path)),
}


# decoder name -> the query `Retriever.search` makes of a file of that kind (a PDF: one page)
QUERY_INPUTS: dict[str, Callable[[Path, int | None], Item]] = {
    "image": lambda path, page: Item(image=path),
    "pdf-pages": lambda path, page: Item(image=path, page=page),
    "video": lambda path, page: Item(video=path),
    "text": lambda path, page: Item(text=read_text_file(path)),
}


def query_item(path: Path, kind: str, page: int | None = None) -> Item:
    """The query made of one file of kind `kind` (a query by example; a PDF needs its `page`)."""
    return QUERY_INPUTS[KINDS[kind].decoder](path, page)


def decode_file(path: Path, kind: str, profile: "CollectionProfile") -> list[Decoded]:
    """The rows of one file of kind `kind` (a `faste_mm.kinds.KINDS` key), decoded now."""
    return DECODERS[KINDS[kind].decoder](path, profile)


def document_input(path: Path, kind: str) -> object:
    """What the plain path hands the embedder for one file of kind `kind` (InputError for a text
    file that cannot be read)."""
    return DOCUMENT_INPUTS[KINDS[kind].decoder](path)

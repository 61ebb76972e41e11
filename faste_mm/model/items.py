"""Stage 1: inputs. Turns what users pass (strings, paths, PIL images, `Item`s) into a flat list of
`Item`s, one per text / image / image+text pair / PDF page; their pixels are read on demand by
`file_decoding`.

Hands on `Item`s (with their source position) to the serializer; unreadable inputs become
`Failure`s that name the file and say what to do.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from os import PathLike
from pathlib import Path
from typing import Iterable, Union

from PIL import Image

from faste_mm.errors import FasteError, InputError
from faste_mm.kinds import is_kind
from faste_mm.model.file_decoding import count_pdf_pages
from faste_mm.model.opened_files import OpenedFile, file_name

ImageLike = Union[str, Path, Image.Image, OpenedFile]


@dataclass(frozen=True, slots=True, eq=False)
class Item:
    """One thing to embed: text, an image, a video, or several (the official order: video, image, text).

    Args:
        text: the text, or None.
        image: a file path (image or PDF), a PIL image or an `OpenedFile`, or None.
        video: a video file path or `OpenedFile` (sampled and resized by `SerializerConfig.video`), or None.
        instruction: the task instruction for this item (queries); None uses the call's instruction,
            then the model's default.
        page: 1-based PDF page; None on a PDF path means "every page" (expanded by `expand_items`).
        max_pixels: pixel cap of this item's resized image; None uses the serializer's
            (`SerializerConfig.max_pixels`). Lets one `encode` call mix image sizes.
    """

    text: str | None = None
    image: ImageLike | None = None
    instruction: str | None = None
    page: int | None = None
    max_pixels: int | None = None
    video: str | Path | OpenedFile | None = None

    def __post_init__(self) -> None:
        if self.text is not None and not isinstance(self.text, str):
            raise InputError(f"Item.text must be a string or None, got {type(self.text).__name__}")
        if self.image is not None and not isinstance(self.image, (str, Path, Image.Image, OpenedFile)):
            raise InputError(
                f"Item.image must be a path or a PIL image, got {type(self.image).__name__}"
            )
        if self.video is not None and not isinstance(self.video, (str, Path, OpenedFile)):
            raise InputError(f"Item.video must be a path to a video file, got {type(self.video).__name__}")
        if self.page is not None and (not isinstance(self.page, int) or self.page < 1):
            raise InputError(f"Item.page is 1-based, got {self.page!r}")
        if self.max_pixels is not None and (not isinstance(self.max_pixels, int) or self.max_pixels < 1):
            raise InputError(f"Item.max_pixels must be a positive number of pixels or None, got {self.max_pixels!r}")

    @property
    def has_image(self) -> bool:
        return self.image is not None

    @property
    def has_video(self) -> bool:
        return self.video is not None

    @property
    def is_pdf(self) -> bool:
        return isinstance(self.image, (str, Path, OpenedFile)) and is_kind(file_name(self.image), "pdf")

    def describe(self) -> str:
        """A short human name for messages: the file (and page), or the start of the text."""
        if self.video is not None:
            return f"{self.video}"
        if isinstance(self.image, (str, Path, OpenedFile)):
            return f"{self.image}" + (f" (page {self.page})" if self.page is not None else "")
        if isinstance(self.image, Image.Image):
            return f"<PIL image {self.image.size[0]}x{self.image.size[1]}>"
        text = self.text or ""
        return repr(text if len(text) <= 40 else text[:37] + "...")


def failure_reason(item: Item, error: BaseException) -> str:
    """Why `item` failed, as every path words it (the embedder, the Ray decoding tasks): a
    FasteError's message, else the error's type and message, led by the item's name. Kept here,
    torch-free, so a decoding task that meets a bad file does not import the model."""
    reason = str(error) if isinstance(error, FasteError) else f"{type(error).__name__}: {error}"
    return reason if item.describe() in reason else f"{item.describe()}: {reason}"


@dataclass(frozen=True, slots=True)
class Failure:
    """An input that could not be embedded. `index` is its row in the result; `source` the input position."""

    index: int
    source: int
    item: str
    reason: str

    def to_dict(self) -> dict:
        return {"index": self.index, "source": self.source, "item": self.item, "reason": self.reason}


def as_item(value: object, position: int) -> Item:
    """A plain `str` is text; a `Path` is a file (a video by its suffix); a PIL image is an image;
    an `Item` passes through."""
    if isinstance(value, Item):
        return value
    if isinstance(value, str):
        return Item(text=value)
    if isinstance(value, Path) and is_kind(value, "video"):
        return Item(video=value)
    if isinstance(value, (Path, Image.Image)):
        return Item(image=value)
    raise InputError(
        f"input {position}: cannot embed a {type(value).__name__}; pass a str (text), a Path, "
        "a PIL image or faste_mm.Item"
    )


def one_or_many(inputs: object) -> Iterable[object]:
    """A lone input (str, path, PIL image, `Item`) as a list of one; a sequence as it is. A str is
    iterable: without this, `encode_queries("a bear")` would embed each of its characters."""
    return [inputs] if isinstance(inputs, (str, PathLike, Item, Image.Image)) else inputs


def expand_items(inputs: object) -> tuple[list[Item], list[int], list[tuple[int, Item, str]]]:
    """Flatten inputs (one input, `one_or_many`, or an iterable of them) into one `Item` per
    embedding row; a PDF path without a page becomes its pages.

    Returns:
        items: the rows to embed, in input order (PDF pages in page order).
        sources: for each row, the position of the input it came from.
        broken: (source, item, reason) for inputs that could not even be expanded (e.g. an
            unreadable PDF); they occupy one row each so the caller can report them in place.
    """
    items: list[Item] = []
    sources: list[int] = []
    broken: list[tuple[int, Item, str]] = []
    for position, value in enumerate(one_or_many(inputs)):
        item = as_item(value, position)
        if item.is_pdf and item.page is None:
            try:
                n_pages = count_pdf_pages(item.image if isinstance(item.image, OpenedFile) else Path(item.image))
            except InputError as error:
                broken.append((len(items), item, str(error)))
                items.append(item)
                sources.append(position)
                continue
            for page in range(1, n_pages + 1):
                items.append(replace(item, page=page))
                sources.append(position)
        else:
            items.append(item)
            sources.append(position)
    return items, sources, broken

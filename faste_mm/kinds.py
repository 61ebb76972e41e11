"""The input kinds: the one table of which files faste-mm reads (suffix -> kind -> stored modality
-> search filter type -> thumbnail rule -> decoder). Scanning, the item model, search filters,
thumbnails, serve and the Ray executor read it; no other module lists a suffix.

Plain data: stands on its own like `errors.py`, so every layer (the model core and the indexers
too) may import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePath


@dataclass(frozen=True, slots=True)
class Kind:
    """One kind of input file.

    name: the kind ("image", "video", "pdf", "text").
    suffixes: lower-case file name suffixes of the kind.
    modality: what a file of this kind stores per item (`ItemRecord.modality`; a PDF one "page"
        item per page).
    filter_type: what `search --type` / `SearchFilter.types` calls it; `matches` lists every
        stored modality it stands for (an image added with a caption is "image+text").
    thumbnail: how the search page pictures an item: "image" (the file), "page" (the rendered
        PDF page), "frame" (a frame of the video) or None (no picture).
    decoder: the name of the decoder that turns a file into embedder input
        (`faste_mm.retrieval.decoders.DECODERS`; the Ray executor decodes with the same table).
    patch_dedup: the suffixes whose pixels duplicate-patch removal (`--patch-dedup`,
        faste_mm.model.patch_dedup) applies to: PDF pages, and images in the lossless formats
        screenshots, slides and scans are saved in; photo formats (JPEG, HEIC, AVIF, WebP) stay whole.
    """

    name: str
    suffixes: frozenset[str]
    modality: str
    filter_type: str
    matches: tuple[str, ...]
    thumbnail: str | None
    decoder: str
    patch_dedup: frozenset[str] = frozenset()


KINDS: dict[str, Kind] = {kind.name: kind for kind in (
    Kind("image", frozenset({".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff",
                              ".heic", ".heif", ".avif"}),
         "image", "image", ("image", "image+text"), "image", "image",
         patch_dedup=frozenset({".png", ".bmp", ".gif", ".tif", ".tiff"})),
    Kind("pdf", frozenset({".pdf"}), "page", "pdf", ("page",), "page", "pdf-pages", patch_dedup=frozenset({".pdf"})),
    Kind("text", frozenset({".txt", ".md"}), "text", "text", ("text",), None, "text"),
    Kind("video", frozenset({".mp4", ".mov", ".webm", ".mkv", ".avi"}),
         "video", "video", ("video", "video+text"), "frame", "video"),
)}
# How a count of each kind's items reads in a sentence ("18,214 images and 2,310 pages").
ITEM_NOUNS: dict[str, str] = {"image": "images", "pdf": "pages", "text": "texts", "video": "videos"}
assert set(ITEM_NOUNS) == set(KINDS), "every input kind needs its noun"
UNSUPPORTED = "unsupported"  # the kind of any other file (recorded as a failure when named)


@dataclass(frozen=True, slots=True)
class Plugin:
    """A Pillow plugin some image suffixes need: `module`'s function `register` adds the opener
    (None: Pillow registers it itself, and `feature` names its codec in `PIL.features`); `extra`
    says how to install it."""

    suffixes: frozenset[str]
    module: str
    register: str | None
    extra: str
    feature: str | None = None


# iPhone photos are HEIC (HEVC in HEIF); pillow-heif (libheif) reads them with their EXIF and XMP.
# AVIF: Pillow >= 11.2 reads it itself where its wheel has libavif (checked when an AVIF opens).
PLUGINS = (Plugin(frozenset({".heic", ".heif"}), "pillow_heif", "register_heif_opener",
                  "pip install 'faste-mm[photos]' (pillow-heif)"),
           Plugin(frozenset({".avif"}), "PIL.AvifImagePlugin", None, "pip install -U 'pillow>=11.2'", feature="avif"))

FILTER_TYPES: dict[str, tuple[str, ...]] = {kind.filter_type: kind.matches for kind in KINDS.values()}
SUPPORTED_SUFFIXES = ", ".join(sorted(s for kind in KINDS.values() for s in kind.suffixes))


def kind_name(path: str | PurePath) -> str:
    """The kind of a file by its name's suffix: a `KINDS` key, or "unsupported"."""
    suffix = PurePath(path).suffix.lower()
    for kind in KINDS.values():
        if suffix in kind.suffixes:
            return kind.name
    return UNSUPPORTED


def dedups_patches(path: str | PurePath) -> bool:
    """Whether duplicate-patch removal applies to `path`'s pixels (its kind's `patch_dedup` suffixes)."""
    suffix = PurePath(path).suffix.lower()
    return any(suffix in kind.patch_dedup for kind in KINDS.values())


def is_kind(path: str | PurePath, name: str) -> bool:
    """Whether `path`'s suffix is one of kind `name`'s."""
    return PurePath(path).suffix.lower() in KINDS[name].suffixes

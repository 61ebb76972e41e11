"""How long an index run will take on this machine: the work its files hold per input kind
(items, planned tokens and pixels to decode or render, from headers alone) and what it has cost
so far, batch by batch: each kind's model seconds per token, and the seconds around the model
(reading, decoding, rendering) per pixel. Receives the run's files (`IngestWork.todo`) and the
`BatchTrace`s of its encode calls; hands `index` a `RunEstimate` (items and seconds left per kind).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from faste_mm.errors import InputError
from faste_mm.kinds import ITEM_NOUNS, KINDS, kind_name  # noqa: F401  (ITEM_NOUNS: the sentences' nouns)
from faste_mm.model.file_decoding import count_pdf_pages
from faste_mm.model.items import Item, as_item
from faste_mm.model.official import PIXELS_PER_VISUAL_TOKEN

KIND_NAMES: tuple[str, ...] = tuple(KINDS)  # the column order of every per-kind array here
# What one item of each kind is called in the estimate's line (a PDF's items are its pages).

PIXELS_PER_TOKEN = PIXELS_PER_VISUAL_TOKEN  # a 16-pixel patch, 2x2 merged: qwen-vl-utils resizes to multiples of 32
PROMPT_TOKENS = 20  # the chat template around an item (a weight among a batch's rows, not exact)
TEXT_BYTES_PER_TOKEN = 4  # UTF-8 prose; the same rule plans the measured and the waiting texts
# Files of each kind put first in a run (`sample_first`), so that its first batches measure
# every kind present.
SAMPLE_PER_KIND = 4
# The estimate settles (is worth telling) once the run's first chunk is committed (every stage
# of its files measured: hashing, reading, decoding, the model, the commit), or once this many
# items are measured, this many of each kind among them: the seconds around the model that a
# batch waits for are uneven (a chunk's files are hashed before its first batch), and a few
# batches' rates are off by more than the estimate's target of 25% (docs/performance.md).
SETTLE_ITEMS = 64


@dataclass(frozen=True, slots=True)
class TokenBounds:
    """What an item's planned tokens depend on: the pixel bounds images and pages are resized
    to (the collection's) and the token cap of a sequence."""

    min_pixels: int
    max_pixels: int
    max_length: int = 8192


@dataclass(frozen=True, slots=True, eq=False)
class KindWork:
    """Work per input kind, in `KIND_NAMES` order, int64 [K]: items, planned tokens, and pixels
    to decode or render (an image's own, a page's at the pixel budget; none for a text)."""

    items: np.ndarray
    tokens: np.ndarray
    pixels: np.ndarray

    @classmethod
    def zeros(cls) -> "KindWork":
        return cls(*(np.zeros(len(KIND_NAMES), dtype=np.int64) for _ in range(3)))

    def __add__(self, other: "KindWork") -> "KindWork":
        return KindWork(self.items + other.items, self.tokens + other.tokens, self.pixels + other.pixels)

    def __sub__(self, other: "KindWork") -> "KindWork":
        """What is left of this work once `other` is done (never below zero)."""
        return KindWork(*(np.maximum(a - b, 0) for a, b in ((self.items, other.items), (self.tokens, other.tokens),
                                                             (self.pixels, other.pixels))))


@dataclass(frozen=True, slots=True, eq=False)
class KindSeconds:
    """Seconds per input kind, in `KIND_NAMES` order: in the model (tower and decoder) and around
    it (waiting for files to be read, decoded and rendered; commits), float64 [K]."""

    model: np.ndarray
    other: np.ndarray

    @classmethod
    def zeros(cls) -> "KindSeconds":
        return cls(np.zeros(len(KIND_NAMES)), np.zeros(len(KIND_NAMES)))

    def __add__(self, other: "KindSeconds") -> "KindSeconds":
        return KindSeconds(self.model + other.model, self.other + other.other)


@dataclass(frozen=True, slots=True, eq=False)
class RowPlan:
    """One encode call's rows (`expand_items` order): kind index int64 [N] into `KIND_NAMES`,
    planned tokens int64 [N] and pixels to decode or render int64 [N]."""

    kinds: np.ndarray
    tokens: np.ndarray
    pixels: np.ndarray


@dataclass(frozen=True, slots=True)
class RunEstimate:
    """How long the rest of an index run takes at the rates measured so far.

    kinds: the kinds with work left, in `KIND_NAMES` order; items_left / seconds_left: per kind.
    is_measured: per kind, False where none of its items was measured yet, so its seconds use
        the measured kinds' seconds per token.
    elapsed_s: the run's seconds when this was made; is_settled: the run's first chunk is
        committed, or enough items of each kind are measured (`SETTLE_ITEMS`): the estimate
        worth telling.
    dtype: the dtype the model runs in ("bfloat16"), which the rates hold for.
    """

    kinds: tuple[str, ...]
    items_left: tuple[int, ...]
    seconds_left: tuple[float, ...]
    is_measured: tuple[bool, ...]
    elapsed_s: float
    is_settled: bool
    dtype: str | None = None

    @property
    def remaining_s(self) -> float:
        return float(sum(self.seconds_left))

    @property
    def total_s(self) -> float:
        """The run's predicted seconds, start to end."""
        return self.elapsed_s + self.remaining_s

    def to_dict(self) -> dict[str, Any]:
        return {"remaining_s": self.remaining_s, "total_s": self.total_s, "elapsed_s": self.elapsed_s,
                "is_settled": self.is_settled, "dtype": self.dtype,
                "kinds": {kind: {"items_left": n, "seconds_left": s, "is_measured": m}
                          for kind, n, s, m in zip(self.kinds, self.items_left, self.seconds_left, self.is_measured)}}


# ---- the arithmetic: arrays in, arrays out ----------------------------------------------------
def share_batch(tokens: np.ndarray, has_image: np.ndarray, tower_s: float, decoder_s: float) -> np.ndarray:
    """Model seconds [B] of one batch's rows: the vision tower's shared among the rows with an
    image by their tokens (a text row never enters the tower), the decoder's among all rows by
    their tokens."""
    weights = np.maximum(tokens.astype(np.float64), 1.0)
    seconds = decoder_s * weights / weights.sum()
    imaged = weights * has_image
    if imaged.sum() > 0:
        seconds += tower_s * imaged / imaged.sum()
    else:  # a tower ran without an image row planned: charge it like the decoder
        seconds += tower_s * weights / weights.sum()
    return seconds


def batch_by_kind(rows: RowPlan, batch_rows: Sequence[int], tower_s: float, decoder_s: float,
                  other_s: float = 0.0) -> tuple[KindSeconds, KindWork]:
    """One batch's seconds and work per kind: its model seconds shared by `share_batch`, the
    seconds around it (`other_s`) among its rows by their pixels. batch_rows: the batch's row
    indices into `rows` (`BatchTrace.rows`)."""
    index = np.asarray([r for r in batch_rows if r < len(rows.kinds)], dtype=np.int64)
    spent, done = KindSeconds.zeros(), KindWork.zeros()
    if index.size == 0:
        return spent, done
    kinds, pixels = rows.kinds[index], np.maximum(rows.pixels[index].astype(np.float64), 1.0)
    np.add.at(spent.model, kinds, share_batch(rows.tokens[index], kinds != KIND_NAMES.index("text"), tower_s, decoder_s))
    np.add.at(spent.other, kinds, other_s * pixels / pixels.sum())
    for total, per_row in ((done.items, 1), (done.tokens, rows.tokens[index]), (done.pixels, rows.pixels[index])):
        np.add.at(total, kinds, per_row)
    return spent, done


def seconds_left(left: KindWork, spent: KindSeconds, done: KindWork) -> tuple[np.ndarray, np.ndarray]:
    """Seconds [K] the work `left` takes at the rates measured on the work `done` in the seconds
    `spent`, and is_measured [K]: each kind's tokens at its model seconds per token (a kind with
    none measured at all measured kinds' rate), and its pixels at the seconds around the model
    per pixel of all kinds together. Those are one rate, not one per kind: while a batch of one
    kind runs, the files of the next are decoded beside it (`model.prefetch`), so a batch's wait
    is not its own kind's cost, but the CPU time they take adds up whichever kind is running.
    Zero seconds when nothing is measured at all."""
    is_measured = done.items > 0
    overall = spent.model.sum() / done.tokens.sum() if done.tokens.sum() > 0 else 0.0
    per_token = np.where(is_measured & (done.tokens > 0), spent.model / np.maximum(done.tokens, 1), overall)
    per_pixel = spent.other.sum() / done.pixels.sum() if done.pixels.sum() > 0 else 0.0
    return left.tokens * per_token + left.pixels * per_pixel, is_measured


def seconds_per_item(rows: RowPlan, traces: Sequence[Any], elapsed_s: float) -> np.ndarray:
    """Seconds [K] one item of each kind took in an encode call of `rows` that ran the batches
    `traces` (`BatchTrace`s) in `elapsed_s`: each batch's model seconds shared among its rows by
    kind, times the call's wall seconds per model second (reading and resizing, overlapped); a
    kind the call embedded none of at the call's mean seconds per item (`faste-mm plan`)."""
    spent, done = KindSeconds.zeros(), KindWork.zeros()
    for trace in traces:
        batch_spent, batch_done = batch_by_kind(rows, trace.rows, trace.tower_s, trace.decoder_s)
        spent, done = spent + batch_spent, done + batch_done
    model = spent.model
    wall = elapsed_s / model.sum() if model.sum() > 0 else 1.0
    mean = elapsed_s / max(int(done.items.sum()), 1)
    return np.where(done.items > 0, wall * model / np.maximum(done.items, 1), mean)


# ---- planned tokens, from headers ------------------------------------------------------------
def image_tokens(width: int, height: int, bounds: TokenBounds) -> int:
    """Planned tokens of a `width` x `height` image: its pixels brought within the bounds (as
    qwen-vl-utils' smart resize does, to the nearest multiple of 32), 1 token per 32x32."""
    pixels = max(width * height, 1)
    scale = 1.0
    if pixels > bounds.max_pixels:
        scale = math.sqrt(bounds.max_pixels / pixels)
    elif pixels < bounds.min_pixels:
        scale = math.sqrt(bounds.min_pixels / pixels)
    side = math.sqrt(PIXELS_PER_TOKEN)
    visual = max(round(width * scale / side), 1) * max(round(height * scale / side), 1)
    return min(visual + PROMPT_TOKENS, bounds.max_length)


def text_tokens(n_bytes: int, bounds: TokenBounds) -> int:
    return min(math.ceil(n_bytes / TEXT_BYTES_PER_TOKEN) + PROMPT_TOKENS, bounds.max_length)


def page_tokens(bounds: TokenBounds) -> int:
    """A PDF page is rendered to the pixel budget (`faste_mm.model.items`), whatever its box."""
    return min(bounds.max_pixels // PIXELS_PER_TOKEN + PROMPT_TOKENS, bounds.max_length)


def file_rows(path: Path, kind: str, size: int, bounds: TokenBounds) -> list[tuple[int, int]]:
    """(planned tokens, pixels to decode or render) of each item a file gives (a PDF one per
    page, rendered at the pixel budget); [] for a file that will fail (unreadable, unsupported).
    size: the file's bytes (a text's length). A video plans the token cap: counting needs the container."""
    try:
        if kind == "image":
            from faste_mm.model.file_decoding import read_image_size

            width, height = read_image_size(Item(image=path))
            return [(image_tokens(width, height, bounds), width * height)]
        if kind == "pdf":
            return [(page_tokens(bounds), bounds.max_pixels)] * count_pdf_pages(path)
    except (InputError, OSError):
        return []
    if kind == "text":
        return [(text_tokens(size, bounds), 0)]
    if kind == "video":
        return [(bounds.max_length, bounds.max_length * PIXELS_PER_TOKEN)]
    return []


def plan_files(files: Sequence[Any], bounds: TokenBounds) -> tuple[list[KindWork], dict[Path, int]]:
    """The work of each file of `files` (`ScannedFile`s, run order), and the page count of each
    PDF (so a run's encode calls need not open them again)."""
    work: list[KindWork] = []
    pages: dict[Path, int] = {}
    for f in files:
        one = KindWork.zeros()
        if f.kind in KINDS:
            rows = file_rows(f.path, f.kind, f.stat.size, bounds)
            column = KIND_NAMES.index(f.kind)
            one.items[column] = len(rows)
            one.tokens[column], one.pixels[column] = (sum(r[i] for r in rows) for i in (0, 1))
            if f.kind == "pdf":
                pages[Path(f.path)] = len(rows)
        work.append(one)
    return work, pages


def plan_rows(values: Sequence[object], bounds: TokenBounds, pages: dict[Path, int] | None = None) -> RowPlan:
    """The rows an encode call of `values` embeds, in `expand_items` order (a PDF path without a
    page is one row per page; an unreadable one one row), with their kind, planned tokens and
    pixels. pages: PDF page counts already known (`plan_files`)."""
    kinds: list[int] = []
    rows: list[tuple[int, int]] = []
    for position, value in enumerate(values):
        try:
            kind, item_rows = _item_rows(as_item(value, position), bounds, pages or {})
        except InputError:
            kind, item_rows = "text", [(PROMPT_TOKENS, 0)]
        kinds.extend([KIND_NAMES.index(kind)] * len(item_rows))
        rows.extend(item_rows)
    tokens, pixels = ([r[i] for r in rows] for i in (0, 1))
    return RowPlan(*(np.array(column, dtype=np.int64) for column in (kinds, tokens, pixels)))


def _item_rows(item: Item, bounds: TokenBounds, pages: dict[Path, int]) -> tuple[str, list[tuple[int, int]]]:
    """An item's kind and its rows' (planned tokens, pixels)."""
    if item.has_video:
        return "video", file_rows(Path(str(item.video)), "video", 0, bounds)
    if item.is_pdf:
        page = (page_tokens(bounds), bounds.max_pixels)
        if item.page is not None:
            return "pdf", [page]
        path = Path(str(item.image))
        n_pages = pages.get(path)
        if n_pages is None:
            try:
                n_pages = count_pdf_pages(path)
            except (InputError, OSError):
                n_pages = 1  # expand_items keeps an unreadable PDF as one (failed) row
        return "pdf", [page] * max(n_pages, 1)
    if item.has_image:
        if isinstance(item.image, (str, Path)) and kind_name(item.image) == "image":
            return "image", file_rows(Path(item.image), "image", 0, bounds) or [(PROMPT_TOKENS, 0)]
        width, height = getattr(item.image, "size", (1, 1))
        return "image", [(image_tokens(width, height, bounds), width * height)]
    return "text", [(text_tokens(len((item.text or "").encode("utf-8")), bounds), 0)]


# ---- one run's meter -------------------------------------------------------------------------
class RunMeter:
    """The planned work of one run's files and what its batches measured (mutable: fed batch by
    batch and commit by commit from `index`'s progress callbacks, in one thread).

    files: the run's files in the order they are committed; bounds: the collection's token bounds.
    """

    def __init__(self, files: Sequence[Any], bounds: TokenBounds) -> None:
        self.bounds = bounds
        work, self.pages = plan_files(files, bounds)
        # after[n]: the work of the files after the first n committed (suffix sums)
        self._after = [KindWork.zeros()]
        for one in reversed(work):
            self._after.append(self._after[-1] + one)
        self._after.reverse()
        self.spent = KindSeconds.zeros()  # measured, the whole run
        self.done = KindWork.zeros()  # the work those seconds did
        self._pending = KindWork.zeros()  # the work measured since the last commit
        self._committed = 0
        self._tick: float | None = None  # when the last batch ended (or the work began)
        self.first: RunEstimate | None = None  # the first settled estimate of the run

    def begin(self, now: float) -> None:
        """The work starts (the batches' seconds count from here)."""
        self._tick = now

    def observe(self, rows: RowPlan, batch_rows: Sequence[int], tower_s: float, decoder_s: float,
                now: float, paused_s: float = 0.0) -> None:
        """One embedded batch: its rows (indices into `rows`), its model seconds, and the time it
        ended (`now`); the wall seconds since the last batch beyond the model's (reading,
        decoding, rendering not overlapped; commits; hashing the next chunk) count too, less
        `paused_s` (loading the model, which the rest of the run does not repeat)."""
        wall = 0.0 if self._tick is None else now - self._tick - paused_s
        self._tick = now
        spent, done = batch_by_kind(rows, batch_rows, tower_s, decoder_s, max(wall - tower_s - decoder_s, 0.0))
        self.spent, self.done, self._pending = self.spent + spent, self.done + done, self._pending + done

    def commit(self, n_files: int) -> None:
        """The run's first `n_files` files are committed: their work is done, however it went."""
        self._committed = min(n_files, len(self._after) - 1)
        self._pending = KindWork.zeros()

    def left(self) -> KindWork:
        """The work not done yet: the files not committed, less the rows measured since the last commit."""
        return self._after[self._committed] - self._pending

    def estimate(self, elapsed_s: float, dtype: str | None = None) -> RunEstimate | None:
        """The estimate at `elapsed_s` seconds into the run, the model running in `dtype`; None
        before any batch is measured."""
        if self.done.items.sum() == 0:
            return None
        left = self.left()
        seconds, is_measured = seconds_left(left, self.spent, self.done)
        sampled = self.done.items >= np.minimum(self._after[0].items, SAMPLE_PER_KIND)
        is_settled = self._committed > 0 or (bool(sampled.all()) and self.done.items.sum() >= SETTLE_ITEMS)
        shown = [k for k in range(len(KIND_NAMES)) if left.items[k] > 0]
        estimate = RunEstimate(tuple(KIND_NAMES[k] for k in shown), tuple(int(left.items[k]) for k in shown),
                               tuple(float(seconds[k]) for k in shown), tuple(bool(is_measured[k]) for k in shown),
                               elapsed_s, is_settled, dtype)
        if self.first is None and estimate.is_settled:
            self.first = estimate
        return estimate


def sample_first(files: Sequence[Any], per_kind: int = SAMPLE_PER_KIND) -> tuple[Any, ...]:
    """`files` (with a `kind`) in the order a run embeds them: the first `per_kind` of each kind
    (PDFs last among them: each is many rows, and the embedder plans its first batches from its
    first 16 rows), then the rest interleaved by kind in proportion to their counts (each kind
    in its own order). Every stretch of the run then holds the kinds in the folder's mix: its
    first batches measure every kind, and the rates measured early are those of the rest (on a
    busy CPU a kind's seconds depend on what is decoded beside it)."""
    taken: dict[str, int] = {}
    first, rest = [], []
    for f in files:
        if taken.get(f.kind, 0) < per_kind:
            taken[f.kind] = taken.get(f.kind, 0) + 1
            first.append(f)
        else:
            rest.append(f)
    first.sort(key=lambda f: f.kind == "pdf")  # stable: scan order otherwise
    counts: dict[str, int] = {}
    for f in rest:
        counts[f.kind] = counts.get(f.kind, 0) + 1
    rank: dict[str, int] = {}
    positions = []  # each file's place in its kind, as a share of the kind: (rank + 0.5) / count
    for f in rest:
        rank[f.kind] = rank.get(f.kind, 0) + 1
        positions.append((rank[f.kind] - 0.5) / counts[f.kind])
    order = sorted(range(len(rest)), key=lambda i: positions[i])  # stable: ties keep scan order
    return (*first, *(rest[i] for i in order))

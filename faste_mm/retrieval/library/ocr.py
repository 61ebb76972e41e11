"""Text inside images (opt-in, `index --ocr`): after an index run commits its files, the live images
and PDF pages that have no text yet (a scan has no text layer) are read with a local OCR engine,
one at a time, and their text is written to the lexical index with the item, so `--mode lexical` and
hybrid search find a number plate or an invoice number. Nothing is re-embedded.

The engine is RapidOCR (`rapidocr-onnxruntime`: PP-OCRv4 detection and recognition as ONNX models
shipped inside the package; nothing is downloaded at run time), loaded once, on first use.
Receives an open, writable `Collection`; hands back an `OcrTally`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
from PIL import Image

from faste_mm.errors import ConfigError, FasteError, InputError
from faste_mm.indexers import Collection, ItemRecord, ocr_rows
from faste_mm.retrieval.lexical import MAX_TEXT_CHARS

log = logging.getLogger(__name__)

OCR_INSTALL = "pip install 'faste-mm[ocr]'"
# Pixels an image or a rendered page is read at, at most (~2000 x 2000): one image at a time, so the
# OCR's memory stays bounded whatever the photo; text a person can read at this size is found.
OCR_MAX_PIXELS = 4_000_000
# The detector's input: the longest side is brought down to this (the package's default scales the
# SHORTEST side up to 736, which makes a wide photo cost several times more for no gain).
DETECT_MAX_SIDE = 1600
# Recognised lines below this confidence are dropped (the package's own default is 0.5).
MIN_LINE_SCORE = 0.5
# A gap between two characters wider than this share of the line's height separates two words.
WORD_GAP = 0.25
WORD_STEP = 1.25
# Items whose text is written in one transaction.
COMMIT_ITEMS = 16
# The kinds of rows that can hold text in their pixels.
OCR_MODALITIES = ("image", "page")


@dataclass
class OcrTally:
    """What one OCR pass did (mutable: counted item by item): items read, items in which text was
    found, items whose text was copied from an identical file already read, seconds spent reading
    (`elapsed_s`)."""

    read: int = 0
    with_text: int = 0
    copied: int = 0
    elapsed_s: float = 0.0


class OcrEngine:
    """RapidOCR, loaded on the first `read` (an index run with nothing to read never loads it)."""

    def __init__(self) -> None:
        self._engine = None

    def _load(self):
        if self._engine is None:
            try:
                from rapidocr_onnxruntime import RapidOCR
            except ImportError:
                raise ConfigError(f"OCR needs rapidocr-onnxruntime (not installed); install the OCR extra: "
                                  f"{OCR_INSTALL}, or index without --ocr") from None
            self._engine = RapidOCR(det_limit_type="max", det_limit_side_len=DETECT_MAX_SIDE,
                                    text_score=MIN_LINE_SCORE)
        return self._engine

    def read(self, image: Image.Image) -> str:
        """The text lines found in `image`, top to bottom, one per line ("" when none)."""
        bgr = np.ascontiguousarray(np.asarray(image.convert("RGB"))[:, :, ::-1])  # the engine works in BGR
        lines, _ = self._load()(bgr, return_word_box=True)
        if not lines:
            return ""
        ordered = sorted(lines, key=lambda line: (min(p[1] for p in line[0]), min(p[0] for p in line[0])))
        return "\n".join(spaced(line[1], line[3] if len(line) > 3 else None) for line in ordered)[:MAX_TEXT_CHARS]


def spaced(text: str, char_boxes) -> str:
    """`text` with a space between two characters whose boxes are further apart than the line's
    letters usually are (gap > WORD_GAP x the line's height, and centre step > WORD_STEP x the median
    step): the recogniser often drops the space between words ("Account7731"), and the lexical
    index needs words. Text that has spaces already, or whose boxes do not match it one to one, is kept."""
    if not char_boxes or " " in text or len(char_boxes) != len(text) or len(text) < 3:
        return text
    boxes = np.asarray(char_boxes, dtype=np.float32)  # [n, 4, 2]
    left, right = boxes[:, :, 0].min(axis=1), boxes[:, :, 0].max(axis=1)
    height = float(np.median(boxes[:, :, 1].max(axis=1) - boxes[:, :, 1].min(axis=1)))
    steps = np.diff((left + right) / 2)
    is_break = (left[1:] - right[:-1] > WORD_GAP * height) & (steps > WORD_STEP * float(np.median(steps)))
    return text[0] + "".join((" " if gap else "") + char for char, gap in zip(text[1:], is_break))


def read_item_image(record: ItemRecord) -> Image.Image | None:
    """The pixels of a stored image or PDF page at most OCR_MAX_PIXELS, or None when its file is not
    the one indexed any more (gone, replaced, or changed since: the next index run embeds and reads
    it again). Decoded from the descriptor `stored_file` checked (the indexed device and inode), so
    a link planted over the file after its vector was made never puts another file's words into the
    lexical index."""
    from faste_mm.model.file_decoding import load_image
    from faste_mm.model.items import Item
    from faste_mm.retrieval.stored_files import stored_file

    try:
        source = stored_file(record)
    except InputError:  # no file (an item added from memory), gone, or not the indexed file any more
        return None
    if record.size is not None and (source.size != record.size or abs(source.mtime - record.mtime) > 1e-6):
        return None
    image = load_image(Item(image=source, page=record.page), OCR_MAX_PIXELS)
    if image.width * image.height > OCR_MAX_PIXELS:
        image.thumbnail((int((OCR_MAX_PIXELS * image.width / image.height) ** 0.5),) * 2)
    return image


def read_text_in_images(col: Collection, engine: OcrEngine, tally: OcrTally | None = None,
                        on_item: Callable[[OcrTally], None] | None = None) -> OcrTally:
    """Read the text of every live image and page of `col` that has none yet (see the module
    docstring) and store it in the lexical index, COMMIT_ITEMS per transaction; an item in which no
    text is found gets the empty text (it is not read again), one whose file cannot be read keeps
    none (it is tried again at the next run). Identical content (same hash and page) is read once."""
    tally = tally or OcrTally()
    pending = col.read(lambda rows: ocr_rows.items_without_body(rows, OCR_MODALITIES))
    keys = [(r.content_hash, r.page) for r in pending if r.content_hash]
    known = col.read(lambda rows: ocr_rows.texts_by_content(rows, keys)) if keys else {}
    done: list[tuple[int, str]] = []
    for record in pending:
        key = (record.content_hash, record.page)
        if record.content_hash and key in known:
            done.append((record.id, known[key]))
            tally.copied += 1
        else:
            text = _read_one(record, engine, tally)
            if text is None:
                continue
            done.append((record.id, text))
            if record.content_hash:
                known[key] = text
        if len(done) >= COMMIT_ITEMS:
            col.set_texts(done)
            done = []
        if on_item is not None:
            on_item(tally)
    if done:
        col.set_texts(done)
    if pending:
        log.info("%s: OCR read %d items (%d with text, %d copied from identical files) in %.1f s", col.root,
                 tally.read, tally.with_text, tally.copied, tally.elapsed_s)
    return tally


def _read_one(record: ItemRecord, engine: OcrEngine, tally: OcrTally) -> str | None:
    """One item's text, or None when its file cannot be read now (logged, tried again next run)."""
    started = time.perf_counter()
    try:
        image = read_item_image(record)
        if image is None:
            return None
        text = engine.read(image)
    except ConfigError:
        raise
    except FasteError as error:  # unreadable now: the next index run re-embeds or drops the file
        log.info("%s: no OCR text (%s)", record.uri, error)
        return None
    except Exception as error:  # noqa: BLE001 - the engine failing on one odd image costs that image's text only
        log.warning("%s: OCR failed (%s: %s); the item stays findable by name", record.uri, type(error).__name__, error)
        text = ""
    else:
        tally.with_text += bool(text)
    tally.read += 1
    tally.elapsed_s += time.perf_counter() - started
    return text

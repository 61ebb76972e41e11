"""Documents embedded into one collection: the encoder `Retriever.index` and `add` use (the
collection's profile, the model loaded on first use and checked against the collection, progress
batch by batch), and what `add` stores for its inputs (records: uri, modality, file stat).

Receives an open `Collection`, its `CollectionProfile` and the retriever's model; hands on
`EmbedResult`s and `ItemRecord`s.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np
from PIL import Image

from faste_mm.errors import InputError
from faste_mm.indexers import Collection, ItemRecord
from faste_mm.indexers.manifest import settings_mismatch
from faste_mm.indexers.records import repeated_key
from faste_mm.model.cost import CostTally
from faste_mm.model.embedder import EmbedResult, OnError
from faste_mm.model.items import Item, as_item
from faste_mm.model.runner import BatchTrace
from faste_mm.retrieval.ingest import IndexFailure, failure_reasons
from faste_mm.retrieval.profile import CollectionProfile
from faste_mm.retrieval.results import AddReport

if TYPE_CHECKING:
    from faste_mm.model.embedder import Embedder

log = logging.getLogger(__name__)


class CollectionDocuments:
    """Embeds documents for one open collection, with its profile's settings.

    The model is loaded on the first call, so an `index` run with nothing new to embed never
    loads it. That call also checks that the loaded model makes vectors comparable with the
    stored ones (the collection may have been opened before the model was known).
    """

    def __init__(self, embedder: Callable[[CollectionProfile], "Embedder"], col: Collection,
                 profile: CollectionProfile) -> None:
        self._embedder = embedder  # the model serializing with a profile's settings (loaded on first use)
        self._col = col
        self._profile = profile
        self._is_checked = False
        self.in_flight = _InFlight()  # the call in progress, batch by batch (zero between calls)
        self.on_batch: Callable[[BatchTrace], None] | None = None  # called after each batch
        self.load_s = 0.0  # seconds spent getting the model (loading it on the first call)
        self.dtype: str | None = None  # the dtype the model runs in, once loaded ("bfloat16")

    def __call__(self, values: Sequence[object], on_error: OnError = "skip") -> EmbedResult:
        refuse_other_pixel_caps(values, self._col.root, self._profile.max_pixels)  # before anything is embedded
        asked = time.perf_counter()
        embedder = self._embedder(self._profile)
        self.load_s += time.perf_counter() - asked
        self.dtype = str(embedder.dtype_choice.dtype).removeprefix("torch.")
        if not self._is_checked:
            errors = self._profile.conflicts(self._profile.as_loaded(embedder))
            if errors:
                raise settings_mismatch(self._col.root, errors)
            self._is_checked = True
        self.in_flight = _InFlight(inputs=len(values), values=values)
        try:
            # Matryoshka collections store the first `dim` dimensions, re-normalised (checked above).
            return embedder.encode_documents(values, fast_e=self._profile.fast_e(), dim=self._profile.dim,
                                             on_error=on_error, on_batch=self._batch_done)
        finally:
            self.in_flight = _InFlight()  # the caller's tally counts the result from now on

    def _batch_done(self, trace: BatchTrace) -> None:
        flight = self.in_flight
        flight.rows += trace.batch_size
        flight.cost = flight.cost + trace
        if self.on_batch is not None:
            self.on_batch(trace)


@dataclass
class _InFlight:
    """Running totals of one document-encoding call (mutable: updated batch by batch)."""

    inputs: int = 0
    values: Sequence[object] = ()  # what the call embeds (its rows are these, expanded)
    rows: int = 0
    cost: CostTally = field(default_factory=CostTally)  # prefix tokens, tower and decoder seconds


# ---- what `add` stores -----------------------------------------------------------------------
def add_documents(col: Collection, encode: CollectionDocuments, items: Sequence[object],
                  metadata: Sequence[Mapping[str, Any] | None] | None, uris: Sequence[str] | None,
                  on_error: OnError) -> AddReport:
    """`Retriever.add` on `col` (opened for writing, closed here): embed `items` with `encode`, then
    store every row, failures included, in one transaction (a crash keeps the rows and their
    failure records together or neither). Raises InputError, storing nothing, as `add` says."""
    with col:
        result = encode(items, on_error)
        reasons = failure_reasons(result)
        if reasons and on_error == "raise":  # only non-finite vectors get here: encode raised the rest
            row = min(reasons)
            raise InputError(f"add: input {result.sources[row]}: {reasons[row]}",
                             hint="or pass on_error='skip' to store the other items")
        records = [add_record(result.items[row], None if uris is None else uris[source],
                               None if metadata is None else metadata[source], reasons.get(row))
                   for row, source in enumerate(result.sources)]
        refuse_repeated_rows(records, result.sources)  # before any write: all rows or none
        ok = np.array([row not in reasons for row in range(len(records))], dtype=bool)
        failed = [records[row] for row in sorted(reasons)]
        ids = np.full(len(records), -1, dtype=np.int64)
        ids[ok] = col.commit(result.embeddings[ok], [r for r, is_ok in zip(records, ok) if is_ok], failed)[0]
    if failed:
        log.info("%s: added %d items, %d failed", col.root, int(ok.sum()), len(failed))
    return AddReport(ids, tuple(IndexFailure(r.uri, r.page, r.error) for r in failed))


def add_record(item: Item, uri: str | None, metadata: Mapping[str, Any] | None, error: str | None) -> ItemRecord:
    """The record `add` stores for one row: an item, or (with `error`) a failure."""
    size, mtime, dev, ino = _file_stat(item)
    return ItemRecord(uri=uri if uri is not None else _default_uri(item, metadata), modality=_modality(item), page=item.page,
                      size=size, mtime=mtime, metadata=metadata, error=error, dev=dev, ino=ino)


def refuse_repeated_rows(records: Sequence[ItemRecord], sources: Sequence[int]) -> None:
    """InputError when two rows of one `add` call (stored or failed) share a (uri, page): the
    second would replace the first, or its failure record would tombstone the first's item."""
    repeated = repeated_key(records)
    if repeated is not None:
        first, second = (sources[row] for row in repeated)
        record = records[repeated[1]]
        page = "" if record.page is None else f" page {record.page}"
        raise InputError(f"add: inputs {first} and {second} are both {record.uri}{page}, and a collection "
                         f"holds one item per (uri, page); nothing was stored. Add it once, or give each "
                         f"its own uri (uris=...)")


def refuse_other_pixel_caps(values: Sequence[object], root: Path, cap: int) -> None:
    """InputError for an image item whose own `Item.max_pixels` differs from the collection's
    (`cap`): it would be resized to another cap, so its vector would not be comparable."""
    for position, value in enumerate(values):
        item = as_item(value, position)
        if item.has_image and item.max_pixels not in (None, cap):
            raise InputError(f"input {position} ({item.describe()}): Item.max_pixels={item.max_pixels}, but "
                             f"the collection {root} embeds images at max_pixels={cap}; drop max_pixels "
                             f"from the item, or add it to another collection; nothing was stored")


def _modality(item: Item) -> str:
    if item.video is not None:
        return "video+text" if item.text or item.image is not None else "video"
    if item.is_pdf:
        return "page"
    if item.image is not None:
        return "image+text" if item.text else "image"
    return "text"


def _default_uri(item: Item, metadata: Mapping[str, Any] | None = None) -> str:
    """A file's resolved path; else "item:" + a hash of the content AND the metadata, so the same
    text added twice with different metadata is two items, while re-adding an identical
    (content, metadata) pair replaces the stored one instead of duplicating it."""
    if item.video is not None and item.image is None and not item.text:
        return str(Path(item.video).expanduser().resolve())
    if isinstance(item.image, (str, Path)) and not item.text and item.video is None:
        return str(Path(item.image).expanduser().resolve())
    h = hashlib.sha256((item.text or "").encode("utf-8"))
    if isinstance(item.image, Image.Image):
        h.update(item.image.tobytes())
    elif item.image is not None:
        h.update(str(Path(item.image).resolve()).encode("utf-8"))
    if item.video is not None:
        h.update(b"video:" + str(Path(item.video).resolve()).encode("utf-8"))
    if metadata is not None:  # None leaves the hash as it was, so earlier uris stay valid
        h.update(b"\0metadata\0" + json.dumps(dict(metadata), sort_keys=True, default=str).encode("utf-8"))
    return "item:" + h.hexdigest()[:16]


def _file_stat(item: Item) -> tuple[int | None, float | None, int | None, int | None]:
    """(size, mtime, dev, ino) of an item that is one file, else Nones."""
    only_file = (item.video if item.image is None else item.image if item.video is None else None)
    if isinstance(only_file, (str, Path)) and not item.text:
        try:
            st = Path(only_file).stat()
        except OSError:  # a missing file is a failed row (on_error="skip"); it has no stat
            return None, None, None, None
        return st.st_size, st.st_mtime, st.st_dev, st.st_ino
    return None, None, None, None

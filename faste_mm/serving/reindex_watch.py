"""The served collection across `index --reindex`: the engine asks on each request whether the
collection was re-created (its generation token changed) and, if so, gets its new profile, the
loaded weights serializing with that profile's pixel and video settings, and why the loaded model
cannot search it when it was re-indexed with another one (`ReindexWatch`). Handler threads read
the collection through `ServedReads`: each thread its own reader, and while the collection is
being re-created a clear 503 "being re-indexed, retry" instead of "not a collection".

Receives the collection folder and the loaded `Embedder`; hands the engine `ServedSettings`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TypeVar

from faste_mm import Embedder
from faste_mm.errors import CollectionError
from faste_mm.indexers.directory import is_being_recreated, read_generation
from faste_mm.retrieval.profile import CollectionProfile, read_profile

T = TypeVar("T")


class CollectionReindexingError(CollectionError):
    """The served collection is being re-created by `index --reindex` (HTTP 503 with Retry-After)."""


@dataclass(frozen=True, slots=True)
class ServedSettings:
    """A re-created collection's profile; `embedder`: the loaded weights with its pixel and video
    settings; `model_changed`: the settings in which the loaded model differs from the one it
    was made with (model id, revision, width), None when the loaded model fits it."""

    profile: CollectionProfile
    embedder: Embedder
    model_changed: str | None


class ReindexWatch:
    """Notices that the collection in `root` was re-created since the last look."""

    def __init__(self, root: Path, loaded: Embedder) -> None:
        self.root = root
        self._loaded = loaded
        self._generation = read_generation(root)
        self._lock = threading.Lock()

    def changed(self) -> ServedSettings | None:
        """The collection's settings if it was re-created since the last call, else None (also
        in the middle of an erase, when there is no collection for a moment: the next call looks
        again). One small file read when nothing changed."""
        generation = read_generation(self.root)
        if generation == self._generation:
            return None
        with self._lock:
            if generation == self._generation:  # another request took this change
                return None
            try:
                profile = read_profile(self.root)
            except CollectionError:
                return None
            self._generation = generation
        errors = profile.conflicts(profile.as_loaded(self._loaded))
        return ServedSettings(profile, self._adapted(profile), "; ".join(errors) if errors else None)

    def being_recreated(self) -> bool:
        """Whether `index --reindex` is re-creating the collection now: it has no manifest (erased,
        or a create not yet complete, or killed part-way), or its generation is not the one last
        served. A search that fails then gets "being re-indexed, retry", never "damaged"."""
        return is_being_recreated(self.root) or read_generation(self.root) != self._generation

    def _adapted(self, profile: CollectionProfile) -> Embedder:
        if not self._loaded.family.is_multimodal:
            return self._loaded
        wanted = profile.serializer(self._loaded.serializer.config)
        return self._loaded if wanted == self._loaded.serializer.config else self._loaded.with_serializer(wanted)


class ServedReads:
    """Reads of the served collection from handler threads. `follow` is the engine's
    `follow_reindex` (a finished re-index is served, not refused), called before each read."""

    def __init__(self, watch: ReindexWatch, follow: Callable[[], None]) -> None:
        self.watch = watch
        self._follow = follow
        self._local = threading.local()

    def refuse_reindexing(self) -> None:
        """CollectionReindexingError while `index --reindex` re-creates the collection: nothing
        is wrong with it, it is being rebuilt (not the reader's "missing" or "damaged")."""
        if self.watch.being_recreated():
            raise self.reindexing_error()

    def reindexing_error(self) -> CollectionReindexingError:
        return CollectionReindexingError(f"the collection {self.watch.root} is being re-indexed "
                                         f"(`faste-mm index --reindex`); retry in a few seconds")

    def guarded(self, read: Callable[[], T]) -> T:
        """`read()`; a CollectionError while the collection is being re-created (or a re-index
        was killed part-way) becomes the 503 "being re-indexed, retry", not a 500."""
        self._follow()
        self.refuse_reindexing()
        try:
            return read()
        except CollectionError:
            if self.watch.being_recreated():
                raise self.reindexing_error() from None
            raise

    def on_thread_reader(self, read: Callable[[object], T]) -> T:
        """`read(the calling thread's reader)`, guarded; a reader that failed is dropped, so the
        thread opens the collection afresh once it is whole again."""
        def on_reader() -> T:
            try:
                return read(self._thread_reader())
            except CollectionError:
                self._drop_thread_reader()
                raise

        return self.guarded(on_reader)

    def _thread_reader(self):
        """The calling thread's own read-only connection, opened afresh when the collection was
        re-created since (its generation token changed): a handler thread never keeps the erased
        collection's files open, nor reads from them."""
        from faste_mm.indexers import Collection

        generation = read_generation(self.watch.root)
        if getattr(self._local, "col", None) is not None and self._local.generation != generation:
            self._drop_thread_reader()
        if getattr(self._local, "col", None) is None:
            self._local.col, self._local.generation = Collection.open(self.watch.root), generation
        return self._local.col

    def _drop_thread_reader(self) -> None:
        col, self._local.col = getattr(self._local, "col", None), None
        if col is not None:
            col.close()

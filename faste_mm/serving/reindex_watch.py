"""The served collection's settings after `index --reindex`: the engine asks on each request
whether the collection was re-created (its generation token changed) and, if so, gets its new
profile, the loaded weights serializing with that profile's pixel and video settings, and why
the loaded model cannot search it when it was re-indexed with another one.

Receives the collection folder and the loaded `Embedder`; hands the engine `ServedSettings`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from faste_mm import Embedder
from faste_mm.errors import CollectionError
from faste_mm.indexers.directory import is_being_recreated, read_generation
from faste_mm.retrieval.profile import CollectionProfile, read_profile


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

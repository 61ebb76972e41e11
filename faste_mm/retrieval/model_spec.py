"""ModelSpec: how a retriever loads its embedding model when it is first needed, so commands that
never embed (info, remove, compact, a lexical search) never load weights; `RetrieverModel`: a
retriever's model, loaded or still a spec. Receives a model id or local directory and load
settings; hands an `Embedder` to the retriever."""

from __future__ import annotations

import dataclasses
import os
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable, ContextManager

from faste_mm.errors import ConfigError
from faste_mm.model.batching import BatchingConfig
from faste_mm.model.embedder import Embedder
from faste_mm.model.serialization import SerializerConfig
from faste_mm.retrieval.executors import ModelSource
from faste_mm.retrieval.profile import CollectionProfile, model_name


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """How to load the embedding model when it is first needed (see `Retriever.open`).

    model_id: hub id or local directory (str or path). revision: None = the hub's main, or
    the collection's when the retriever opens one. loading: a context manager factory the load
    runs in, given the model's name (the CLI shows a "loading" status with it)."""

    model_id: str | os.PathLike
    revision: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    batching: BatchingConfig | None = None
    serializer: SerializerConfig | None = None
    loading: Callable[[str], ContextManager[Any]] | None = None

    @property
    def name(self) -> str:
        """The model id the loaded Embedder reports: a local directory by its absolute path, so
        `Retriever.open` finds it again from any working directory; a hub id as given."""
        return model_name(self.model_id)

    def load(self) -> Embedder:
        with (self.loading or _no_status)(self.name):
            return Embedder.from_pretrained(self.name, device=self.device, dtype=self.dtype, revision=self.revision,
                                            batching=self.batching, serializer=self.serializer)


def _no_status(name: str) -> ContextManager[None]:
    return nullcontext()


class RetrieverModel:
    """A retriever's embedding model: an `Embedder` handed over loaded, or a `ModelSpec` loaded the
    first time something is embedded; and the same weights serializing with a collection's pixel and
    video settings. It exists so "which model, is it loaded yet, how do a Ray worker and a reranker
    find it" is answered in one place, not by two optional fields that every caller tests.

    model: an `Embedder` or a `ModelSpec`; ConfigError for anything else."""

    def __init__(self, model: Embedder | ModelSpec) -> None:
        self.loaded = model if isinstance(model, Embedder) else None  # None until the spec is loaded
        self.spec = model if isinstance(model, ModelSpec) else None
        if self.loaded is None and self.spec is None:
            raise ConfigError(f"Retriever model must be an Embedder or a ModelSpec, got {type(model).__name__}")
        self._adapted: Embedder | None = None  # the loaded weights with a collection's pixel settings

    @property
    def model_id(self) -> str:
        """The model's id, known without loading it."""
        return self.loaded.model_id if self.loaded is not None else self.spec.name

    def identity(self) -> dict[str, Any]:
        """The model as a collection's settings name it: `model_id` and `model_revision` (None: not known yet)."""
        if self.loaded is not None:
            return {"model_id": self.loaded.model_id, "model_revision": self.loaded.loaded.revision}
        return {"model_id": self.spec.name, "model_revision": self.spec.revision}

    def serializer(self) -> SerializerConfig | None:
        """The pixel and video settings the model serializes with (None: a text model, or a model
        not loaded yet without its own: the defaults)."""
        if self.loaded is not None:
            return self.loaded.serializer.config if self.loaded.family.is_multimodal else None
        return self.spec.serializer

    def load(self, settings: Callable[[], CollectionProfile]) -> Embedder:
        """The model, loaded now if it was not: with the spec's serializer, else with the pixel and
        video settings of `settings()` (the collection's profile, or the given settings')."""
        if self.loaded is None:
            spec = self.spec
            if spec.serializer is None:
                spec = dataclasses.replace(spec, serializer=settings().serializer())
            self.loaded = spec.load()
        return self.loaded

    def serializing(self, profile: CollectionProfile, settings: Callable[[], CollectionProfile]) -> Embedder:
        """The model serializing with `profile`'s pixel and video settings: the loaded one (`load`),
        or the same weights with the profile's serializer (`Embedder.with_serializer`), kept so the
        next call with these settings reuses it."""
        embedder = self.load(settings)
        if not embedder.family.is_multimodal:
            return embedder
        wanted = profile.serializer(embedder.serializer.config)
        if wanted == embedder.serializer.config:
            return embedder
        if self._adapted is None or self._adapted.serializer.config != wanted:
            self._adapted = embedder.with_serializer(wanted)
        return self._adapted

    def source(self) -> ModelSource:
        """The model as another process (a Ray worker) loads it."""
        if self.loaded is not None:
            return ModelSource(self.loaded.model_id, self.loaded.loaded.revision,
                               str(self.loaded.backbone.dtype).removeprefix("torch."), self.loaded.batching)
        return ModelSource(self.spec.name, self.spec.revision, self.spec.dtype, self.spec.batching)

    @property
    def device(self) -> str:
        """Where the model runs (the spec's device when it came as one): a collection's reranker loads there too."""
        return self.spec.device if self.spec is not None else str(self.loaded.backbone.device)

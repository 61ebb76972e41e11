"""ModelSpec: how a retriever loads its embedding model when it is first needed, so commands that
never embed (info, remove, compact, a lexical search) never load weights. Receives a model id or
local directory and load settings; hands an `Embedder` to the retriever."""

from __future__ import annotations

import os
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable, ContextManager

from faste_mm.model.batching import BatchingConfig
from faste_mm.model.embedder import Embedder
from faste_mm.model.serialization import SerializerConfig
from faste_mm.retrieval.executors import ModelSource
from faste_mm.retrieval.profile import model_name


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


def model_source(embedder: Embedder | None, spec: ModelSpec | None) -> ModelSource:
    """The model a retriever embeds with (`embedder` once loaded, else `spec`), as another process
    (a Ray worker) loads it."""
    if embedder is not None:
        return ModelSource(embedder.model_id, embedder.loaded.revision,
                           str(embedder.backbone.dtype).removeprefix("torch."), embedder.batching)
    return ModelSource(spec.name, spec.revision, spec.dtype, spec.batching)

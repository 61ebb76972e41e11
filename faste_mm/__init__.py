"""faste-mm: search photos, PDF pages and notes by meaning with Qwen3-VL-Embedding, made cheaper
by FastE prefix-state compression.

The public names resolve lazily (PEP 562): `import faste_mm` loads no torch, transformers or
FAISS, so the CLI answers `--help` at once; the first use of a name imports its module.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS = {
    "BatchingConfig": "faste_mm.model.batching",
    "FastEConfig": "faste_mm.model.faste",
    "EmbedResult": "faste_mm.model.embedder",
    "Embedder": "faste_mm.model.embedder",
    "EmbedStats": "faste_mm.model.embedder",
    "Failure": "faste_mm.model.items",
    "Item": "faste_mm.model.items",
    "Ranking": "faste_mm.model.rerank.results",
    "RerankResult": "faste_mm.model.rerank.results",
    "Reranker": "faste_mm.model.rerank.reranker",
    "SerializerConfig": "faste_mm.model.serialization",
    "TextPrompt": "faste_mm.model.serialization",
    "AddReport": "faste_mm.retrieval.results",
    "Hit": "faste_mm.retrieval.results",
    "IndexReport": "faste_mm.retrieval.results",
    "RemoveReport": "faste_mm.retrieval.results",
    "Retriever": "faste_mm.retrieval.retriever",
    "CollectionError": "faste_mm.errors",
    "ConfigError": "faste_mm.errors",
    "FasteError": "faste_mm.errors",
    "InputError": "faste_mm.errors",
    "ModelLoadError": "faste_mm.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'faste_mm' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


if TYPE_CHECKING:  # for type checkers and IDEs only; never executed
    from faste_mm.errors import CollectionError, ConfigError, FasteError, InputError, ModelLoadError
    from faste_mm.model.batching import BatchingConfig
    from faste_mm.model.embedder import EmbedResult, Embedder, EmbedStats
    from faste_mm.model.faste import FastEConfig
    from faste_mm.model.items import Failure, Item
    from faste_mm.model.rerank.results import Ranking, RerankResult
    from faste_mm.model.rerank.reranker import Reranker
    from faste_mm.model.serialization import SerializerConfig, TextPrompt
    from faste_mm.retrieval.results import AddReport, Hit, IndexReport, RemoveReport
    from faste_mm.retrieval.retriever import Retriever

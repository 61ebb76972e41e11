"""faste-mm: Qwen3-VL-Embedding retrieval with FastE readout-triggered prefix-state compression."""

from faste_mm.batching import BatchingConfig
from faste_mm.compressors import FastEConfig
from faste_mm.embedder import EmbedResult, Embedder, EmbedStats
from faste_mm.errors import CollectionError, ConfigError, FasteError, InputError, ModelLoadError
from faste_mm.items import Failure, Item
from faste_mm.serialization import SerializerConfig, TextPrompt
from faste_mm.retriever import AddReport, Hit, IndexReport, RemoveReport, Retriever

__version__ = "0.1.0"

__all__ = [
    "AddReport",
    "BatchingConfig",
    "CollectionError",
    "ConfigError",
    "EmbedResult",
    "EmbedStats",
    "Embedder",
    "FastEConfig",
    "Failure",
    "FasteError",
    "Hit",
    "IndexReport",
    "InputError",
    "Item",
    "ModelLoadError",
    "RemoveReport",
    "Retriever",
    "SerializerConfig",
    "TextPrompt",
]

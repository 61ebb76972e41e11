"""faste-mm: Qwen3-VL-Embedding retrieval with FastE readout-triggered prefix-state compression."""

from faste_mm.batching import BatchingConfig
from faste_mm.compressors import FastEConfig
from faste_mm.embedder import EmbedResult, Embedder, EmbedStats
from faste_mm.errors import CollectionError, ConfigError, FasteError, InputError, ModelLoadError
from faste_mm.items import Failure, Item
from faste_mm.serialization import SerializerConfig, TextPrompt
from faste_mm.retriever import Hit, Retriever

__version__ = "0.1.0"

__all__ = [
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
    "InputError",
    "Item",
    "ModelLoadError",
    "Retriever",
    "SerializerConfig",
    "TextPrompt",
]

"""An image document's part of every reranker pair, encoded once and reused across queries. A pair's
prompt is the query's head (system turn, instruction, query, `\\n<Document>:`) followed by the
document's tail, from its `<|vision_start|>` to the end of the generation prompt. The tail depends on
the document alone, and a special token splits the tokenizer's input, so the pair's ids are the
head's ids followed by the tail's: the processor's work on a candidate (patching and normalising its
pixels, tokenizing its image pads and text) and the SHA-256 of its patches (the tower cache's key)
are done on the first query, not on every one (docs/rerank.md "Warm queries").

Key: the file's identity and pixel bounds (`resized_images.file_identity`: a replaced or rewritten
file is encoded again) and the tail's prompt text. Bounded by bytes (least recently used out first);
in-memory images have no identity and are encoded per pair, as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from faste_mm.model.items import Item
from faste_mm.model.rerank.bytes_lru import BytesLRU
from faste_mm.model.rerank.resized_images import file_identity


@dataclass(frozen=True, slots=True)
class EncodedPart:
    """Token ids, their multimodal types, and the pixels of the part's images as the processor
    gives them, with the SHA-256 of each image's patches (`tower_cache.patch_digest`)."""

    input_ids: torch.Tensor  # [T] int64
    mm_token_type_ids: torch.Tensor  # [T]
    pixel_values: torch.Tensor | None  # [P, C] float32, the part's images' patches
    image_grid_thw: torch.Tensor | None  # [n_images, 3]
    digests: tuple[str, ...]  # one per image, in order

    @property
    def nbytes(self) -> int:
        pixels = 0 if self.pixel_values is None else self.pixel_values.numel() * self.pixel_values.element_size()
        return pixels + self.input_ids.numel() * 8 * 2


class DocumentTails:
    """A bytes-bounded LRU (`BytesLRU`, thread-safe) of documents' encoded tails.

    Example:
        >>> tails = DocumentTails(512 << 20)
        >>> tail = tails.get(item, bounds, tail_text, lambda: encode(tail_text, image))
    """

    def __init__(self, max_bytes: int) -> None:
        self._parts = BytesLRU(max_bytes)
        self.hits = self.misses = 0  # counters for stats (updated without a lock: approximate under threads)

    def get(self, item: Item, bounds: tuple[int, int], text: str, encode: Callable[[], EncodedPart]) -> EncodedPart | None:
        """The document's tail: kept, or `encode()`d and kept; None for an item without a file
        identity (an in-memory image: the caller encodes the whole pair)."""
        identity = file_identity(item, bounds)
        if identity is None:
            return None
        key = (identity, text)
        part = self._parts.get(key)
        if part is not None:
            self.hits += 1
            return part
        part = encode()
        self.misses += 1
        self._parts.keep(key, part.nbytes, lambda: part)
        return part

    def clear(self) -> None:
        self._parts.clear()

    @property
    def nbytes(self) -> int:
        return self._parts.nbytes

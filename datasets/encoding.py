"""Embedding one side of a task for one setting: items -> one `Embedder.encode` call (progress
reported per batch) -> vectors + `EncodeStats`; stored per (model, task, setting) in an
`EmbeddingCache` so an interrupted evaluation resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Protocol

import numpy as np

from faste_mm.model.cost import CostTally
from faste_mm.model.embedder import Embedder, EmbedStats
from faste_mm.errors import ConfigError, FasteError
from faste_mm.indexers.atomic_files import atomic_write
from faste_mm.model.items import Item

log = logging.getLogger(__name__)

CACHE_VERSION = 1
# Pixels per visual token when neither the processor nor the model config says: Qwen3-VL's
# 16 px patches merged 2x2 -> one token per 32x32 px.
DEFAULT_TOKEN_PIXELS = 32 * 32


class ProgressSink(Protocol):
    """Receives progress; the CLI renders it (library code never draws)."""

    def start(self, phase: str, total: int) -> None: ...

    def advance(self, n: int) -> None: ...


class _NoProgress:
    def start(self, phase: str, total: int) -> None:
        pass

    def advance(self, n: int) -> None:
        pass


NO_PROGRESS = _NoProgress()


@dataclass(frozen=True, slots=True)
class EncodeStats(CostTally):
    """Totals over the embed calls of one (task, side, setting): their `CostTally` and FLOPs as
    `EmbedStats`."""

    n_items: int = 0
    n_failed: int = 0
    flops_full: int = 0
    flops_realised: int = 0
    trigger_layer_sum: int = 0  # over compressed batches
    n_compressed_batches: int = 0
    forward_s: float = 0.0
    elapsed_s: float = 0.0

    @classmethod
    def from_embed(cls, stats: EmbedStats) -> "EncodeStats":
        triggers = [trace.trigger_layer for trace in stats.batches if trace.trigger_layer is not None]
        return cls(
            n_items=stats.n_items,
            n_failed=stats.n_failed,
            flops_full=stats.flops_full,
            flops_realised=stats.flops_realised,
            trigger_layer_sum=sum(triggers),
            n_compressed_batches=len(triggers),
            forward_s=stats.forward_s,
            elapsed_s=stats.elapsed_s,
            **stats.cost_fields(),
        )

    def __add__(self, other: "EncodeStats") -> "EncodeStats":
        return EncodeStats(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    @property
    def mean_trigger_layer(self) -> float | None:
        """Mean over compressed batches (the trigger is a batch decision); None if none compressed."""
        return self.trigger_layer_sum / self.n_compressed_batches if self.n_compressed_batches else None

    def to_dict(self) -> dict:
        return {**asdict(self), "mean_trigger_layer": self.mean_trigger_layer}

    @classmethod
    def from_dict(cls, data: dict) -> "EncodeStats":
        if "elapsed_s" not in data:  # a cache written before durations were spelled elapsed_s
            data = {**data, "elapsed_s": data["total_s"]}
        return cls(**{f.name: data[f.name] for f in fields(cls)})


def encode_items(
    embedder: Embedder,
    items: list[Item],
    *,
    is_query: bool,
    fast_e=None,
    progress: ProgressSink = NO_PROGRESS,
) -> tuple[np.ndarray, EncodeStats]:
    """Embed `items` (queries: their own instructions; documents: the default one).

    Returns float32 [n, d] unit rows in item order (zero rows for items that failed, which are
    logged and counted in `n_failed`) and the summed stats.
    """
    encode = embedder.encode_queries if is_query else embedder.encode_documents
    result = encode(items, fast_e=fast_e, on_error="skip", progress=progress.advance)
    for failure in result.failures:
        log.warning("item %d skipped: %s", failure.source, failure.reason)
    return result.embeddings, EncodeStats.from_embed(result.stats)


def token_pixels(embedder: Embedder) -> int:
    """Image pixels per visual token: (patch_size * merge_size)^2 from the image processor, else
    (patch_size * spatial_merge_size)^2 from the model's vision config, else DEFAULT_TOKEN_PIXELS
    (1024, Qwen3-VL). The processor comes first: it is what turns pixels into tokens."""
    processor = getattr(getattr(embedder.serializer, "processor", None), "image_processor", None)
    side = _token_side(processor, "merge_size")
    if side is None:
        vision = getattr(getattr(embedder.backbone.model, "config", None), "vision_config", None)
        side = _token_side(vision, "spatial_merge_size")
    return DEFAULT_TOKEN_PIXELS if side is None else side * side


def _token_side(source: object, merge_name: str) -> int | None:
    patch, merge = getattr(source, "patch_size", None), getattr(source, merge_name, None)
    if isinstance(patch, int) and isinstance(merge, int) and patch > 0 and merge > 0:
        return patch * merge
    return None


def downscale_pixels(embedder: Embedder, items: list[Item], r_max: float) -> list[int | None]:
    """Per item, the max_pixels that leaves about (1 - r_max) of its visual tokens.

    The original count comes from the official resize of the image's header size (no pixel data
    is decoded; see `VLSerializer.resized_size`); the cap is rounded down to whole tokens and
    never below min_pixels, so smart_resize keeps at most the budget. None: the item has no
    image, or its size cannot be read (it is embedded unchanged and the encode reports it).
    """
    serializer = embedder.serializer
    if not embedder.family.is_multimodal:
        raise ConfigError(f"downscaling needs a vision-language model; {embedder.model_id} has no image processor")
    pixels_per_token = token_pixels(embedder)
    caps: list[int | None] = []
    for item in items:
        if not item.has_image:
            caps.append(None)  # text-only candidates (DocVQA answers) are unaffected by downscaling
            continue
        try:
            width, height = serializer.resized_size(item)
        except FasteError as error:
            log.warning("downscale plan: %s; embedding it at the default size", error)
            caps.append(None)
            continue
        tokens = width * height // pixels_per_token
        caps.append(max(serializer.config.min_pixels, int(tokens * (1.0 - r_max)) * pixels_per_token))
    return caps


def encode_downscaled(
    embedder: Embedder, items: list[Item], r_max: float, *, progress: ProgressSink = NO_PROGRESS
) -> tuple[np.ndarray, EncodeStats]:
    """The downscaling baseline: each image carries its own lower max_pixels (`Item.max_pixels`)
    and the whole side is embedded in one full-forward call, batched like every other setting.
    Planning time counts as end-to-end time."""
    started = time.perf_counter()
    caps = downscale_pixels(embedder, items, r_max)
    capped = [item if cap is None else replace(item, max_pixels=cap) for item, cap in zip(items, caps)]
    plan_s = time.perf_counter() - started
    vectors, stats = encode_items(embedder, capped, is_query=False, progress=progress)
    return vectors, EncodeStats(elapsed_s=plan_s) + stats


def fingerprint(model_id: str, setting: dict, items: list[Item]) -> str:
    """Identifies what a cached file holds: model, setting and every item (text, image, instruction,
    and its own max_pixels when set)."""
    digest = hashlib.sha256(json.dumps({"model": model_id, "setting": setting, "version": CACHE_VERSION}, sort_keys=True).encode())
    for item in items:
        parts = [item.text, None if item.image is None else str(item.image), item.instruction]
        # An item's own pixel cap changes its vector; appended only when set, so fingerprints
        # of items without one (every cache written so far) stay valid.
        parts += [] if item.max_pixels is None else [item.max_pixels]
        digest.update(json.dumps(parts).encode())
    return digest.hexdigest()


class EmbeddingCache:
    """Vectors and stats per (model, task, setting) under `root`, written atomically.

    Files: root/<model>/<subset>/<setting>.npy and .json; the .json (written last) holds the
    fingerprint and stats, so a half-written pair is simply recomputed.
    """

    def __init__(self, root: str | Path, model_id: str) -> None:
        slug = re.sub(r"[^A-Za-z0-9._-]+", "--", model_id.strip("/"))[-80:] or "model"
        self.root = Path(root) / f"{slug}-{hashlib.sha256(model_id.encode()).hexdigest()[:8]}"

    def _paths(self, subset: str, key: str) -> tuple[Path, Path]:
        folder = self.root / subset
        return folder / f"{key}.npy", folder / f"{key}.json"

    def load(self, subset: str, key: str, fingerprint: str) -> tuple[np.ndarray, EncodeStats] | None:
        vectors_path, meta_path = self._paths(subset, key)
        try:
            meta = json.loads(meta_path.read_text())
            if meta.get("fingerprint") != fingerprint:
                return None
            vectors = np.load(vectors_path)
        except (OSError, ValueError, KeyError):
            return None
        log.info("resumed %s/%s from %s", subset, key, vectors_path)
        return vectors, EncodeStats.from_dict(meta["stats"])

    def save(self, subset: str, key: str, fingerprint: str, vectors: np.ndarray, stats: EncodeStats) -> None:
        vectors_path, meta_path = self._paths(subset, key)
        vectors_path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(vectors_path, lambda f: np.save(f, vectors))
        meta = {"fingerprint": fingerprint, "stats": stats.to_dict()}
        atomic_write(meta_path, lambda f: f.write(json.dumps(meta, indent=1).encode()))

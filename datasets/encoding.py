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

from faste_mm.embedder import Embedder, EmbedStats
from faste_mm.errors import ConfigError, FasteError
from faste_mm.indexers._atomic import atomic_write
from faste_mm.items import Item
from faste_mm.serialization import SerializerConfig

log = logging.getLogger(__name__)

CACHE_VERSION = 1
TOKEN_PIXELS = 32 * 32  # one visual token of Qwen3-VL: a 16 px patch merged 2x2


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
class EncodeStats:
    """Totals over the embed calls of one (task, side, setting); FLOPs as `EmbedStats`."""

    n_items: int = 0
    n_failed: int = 0
    prefix_tokens: int = 0
    kept_prefix_tokens: int = 0
    flops_full: int = 0
    flops_realised: int = 0
    trigger_layer_sum: int = 0  # over compressed batches
    n_compressed_batches: int = 0
    forward_s: float = 0.0
    total_s: float = 0.0

    @classmethod
    def from_embed(cls, stats: EmbedStats) -> "EncodeStats":
        triggers = [trace.trigger_layer for trace in stats.batches if trace.trigger_layer is not None]
        return cls(
            n_items=stats.n_items,
            n_failed=stats.n_failed,
            prefix_tokens=stats.prefix_tokens,
            kept_prefix_tokens=stats.kept_prefix_tokens,
            flops_full=stats.flops_full,
            flops_realised=stats.flops_realised,
            trigger_layer_sum=sum(triggers),
            n_compressed_batches=len(triggers),
            forward_s=stats.forward_s,
            total_s=stats.total_s,
        )

    def __add__(self, other: "EncodeStats") -> "EncodeStats":
        return EncodeStats(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    @property
    def mean_trigger_layer(self) -> float | None:
        """Mean over compressed batches (the trigger is a batch decision); None if none compressed."""
        return self.trigger_layer_sum / self.n_compressed_batches if self.n_compressed_batches else None

    def to_dict(self) -> dict:
        return {**asdict(self), "mean_trigger_layer": self.mean_trigger_layer}

    @classmethod
    def from_dict(cls, data: dict) -> "EncodeStats":
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


def downscale_pixels(embedder: Embedder, items: list[Item], r_max: float) -> list[int | None]:
    """Per item, the max_pixels that leaves about (1 - r_max) of its visual tokens (None: no image).

    The original count comes from the official resize (a token is 32x32 px); the cap is rounded
    down to whole tokens and never below min_pixels, so smart_resize keeps at most the budget.
    """
    prepare = getattr(embedder.serializer, "prepare_image", None)
    if prepare is None:
        raise ConfigError(f"downscaling needs a vision-language model; {embedder.model_id} has no image processor")
    config: SerializerConfig = embedder.serializer.config
    caps: list[int | None] = []
    for item in items:
        if not item.has_image:
            caps.append(None)  # text-only candidates (DocVQA answers) are unaffected by downscaling
            continue
        try:
            width, height = prepare(item).size
        except FasteError as error:
            log.warning("downscale plan: %s; embedding it at the default size", error)
            caps.append(config.max_pixels)
            continue
        tokens = width * height // TOKEN_PIXELS
        caps.append(max(config.min_pixels, int(tokens * (1.0 - r_max)) * TOKEN_PIXELS))
    return caps


def encode_downscaled(
    embedder: Embedder, items: list[Item], r_max: float, *, progress: ProgressSink = NO_PROGRESS
) -> tuple[np.ndarray, EncodeStats]:
    """The downscaling baseline: each image re-serialized with its own lower max_pixels; items
    sharing a cap are embedded together (full forward). Planning time counts as end-to-end time."""
    started = time.perf_counter()
    caps = downscale_pixels(embedder, items, r_max)
    plan_s = time.perf_counter() - started
    vectors = np.zeros((len(items), embedder.dim), dtype=np.float32)
    total = EncodeStats(total_s=plan_s)
    base = embedder.serializer.config if hasattr(embedder.serializer, "config") else None
    for cap in sorted(set(caps), key=lambda c: -1 if c is None else c):
        rows = [i for i, c in enumerate(caps) if c == cap]
        runner = embedder if cap is None or base is None else embedder.with_serializer(replace(base, max_pixels=cap))
        part, stats = encode_items(runner, [items[i] for i in rows], is_query=False, progress=progress)
        vectors[rows] = part
        total = total + stats
    return vectors, total


def fingerprint(model_id: str, setting: dict, items: list[Item]) -> str:
    """Identifies what a cached file holds: model, setting and every item (text, image, instruction)."""
    digest = hashlib.sha256(json.dumps({"model": model_id, "setting": setting, "version": CACHE_VERSION}, sort_keys=True).encode())
    for item in items:
        digest.update(json.dumps([item.text, None if item.image is None else str(item.image), item.instruction]).encode())
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

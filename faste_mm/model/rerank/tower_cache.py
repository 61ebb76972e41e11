"""Vision tower features kept across queries. A reranker runs every candidate page or photo through
the vision tower once per (query, candidate) pair, yet the tower's output depends on the image alone:
this cache stands in front of `Backbone.encode_vision` and runs the tower only on the images and
videos it has not seen. Receives a batch (its pixels on the host for the keys); hands on the same
`VisionFeatures` the tower would, assembled from kept and fresh per-image features.

Key: the model, its dtype, the image's patch grid and a SHA-256 hash of its resized patches (the
pixels after the pixel budget, so a different budget or a changed file is a different key).
Bounded by bytes (least recently used out first); an entry larger than the bound is not kept.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace

import torch

from faste_mm.errors import ConfigError
from faste_mm.model.backbones.vision_tower import VisionFeatures
from faste_mm.model.batching import Batch
from faste_mm.model.rerank.bytes_lru import BytesLRU

# 1 GiB: about 50 pages at the 2B shape in bfloat16 (1,280 visual tokens x 2,048 x 4 levels x 2 bytes
# = 21 MB each; 100 in float32 photos of 640x480). Settable per reranker (tower_cache_bytes).
DEFAULT_TOWER_CACHE_BYTES = 1 << 30

Key = tuple


@dataclass(frozen=True, slots=True)
class CacheStats:
    """Counters since the cache was made: images / videos found, computed, and tower calls."""

    hits: int
    misses: int
    tower_calls: int
    entries: int
    bytes: int

    def to_dict(self) -> dict:
        return {"hits": self.hits, "misses": self.misses, "tower_calls": self.tower_calls,
                "entries": self.entries, "bytes": self.bytes}


def patch_digest(patches: torch.Tensor) -> str:
    """The content part of a unit's key: SHA-256 of its patches' bytes (no copy on the host).
    SHA-256, not BLAKE2: with the SHA extensions of current x86 CPUs it hashes a page's 9.6 MB of
    float32 patches in 9.5 ms, BLAKE2b in 22 ms (docs/benchmarks-log.md, round 4)."""
    return hashlib.sha256(patches.detach().cpu().contiguous().numpy().data).hexdigest()[:32]


def _units(batch: Batch) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(kind, patches [P, C], grid [1, 3]) per image, then per video: the tower's input order."""
    units = []
    for kind, pixels, grids in (("image", batch.pixel_values, batch.image_grid_thw),
                                ("video", batch.pixel_values_videos, batch.video_grid_thw)):
        if pixels is None:
            continue
        start = 0
        for row in range(grids.shape[0]):
            size = int(grids[row].prod())
            units.append((kind, pixels[start : start + size], grids[row : row + 1]))
            start += size
    return units


def _per_unit(vision: VisionFeatures) -> list[tuple[torch.Tensor, tuple[torch.Tensor, ...]]]:
    """A tower call's output split per image / video: (merged, deepstack levels), views (no copy)."""
    out, start = [], 0
    for size in vision.sizes:
        out.append((vision.merged[start : start + size], tuple(level[start : start + size] for level in vision.deepstack)))
        start += size
    return out


class TowerCache:
    """A bytes-bounded LRU of per-image (and per-video) tower outputs for one model.

    Example:
        >>> cache = TowerCache(256 << 20, namespace="Qwen/Qwen3-VL-Reranker-2B")
        >>> keys = cache.keys(batch)                     # on the host copy of the batch
        >>> vision = cache.encode(backbone, batch.to(device), keys)
    """

    def __init__(self, max_bytes: int = DEFAULT_TOWER_CACHE_BYTES, namespace: str = "") -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ConfigError(f"tower_cache_bytes must be an int >= 0 (bytes; 0 turns the cache off), got {max_bytes!r}")
        self.max_bytes = max_bytes
        self.namespace = namespace
        self._entries = BytesLRU(max_bytes)  # key -> (merged, deepstack levels)
        self._hits = self._misses = self._calls = 0

    def stats(self) -> CacheStats:
        return CacheStats(self._hits, self._misses, self._calls, len(self._entries), self._entries.nbytes)

    def clear(self) -> None:
        self._entries.clear()

    def keys(self, batch: Batch, digests: tuple[str, ...] | None = None) -> list[Key] | None:
        """The key of each image / video of a host batch, or of one serialized pair (the same
        fields; None without pixels). Hashes the patch bytes where they lie (no copy), unless
        `digests` gives each unit's `patch_digest` already (a document's tail, hashed once)."""
        units = _units(batch)
        if not units:
            return None
        if digests is not None and len(digests) != len(units):
            digests = None
        keys = []
        for n, (kind, patches, grid) in enumerate(units):
            digest = patch_digest(patches) if digests is None else digests[n]
            keys.append((self.namespace, str(patches.dtype), kind, tuple(grid[0].tolist()), digest))
        return keys

    def encode(self, backbone, batch: Batch, keys: list[Key] | None) -> VisionFeatures | None:
        """`backbone.encode_vision(batch)`, with the tower run only on the images / videos whose key
        is not kept (in one packed call, like the tower's own); `keys` from `keys(host batch)`."""
        if keys is None:
            return None
        found = [self._entries.get(key) for key in keys]
        missing = [i for i, entry in enumerate(found) if entry is None]
        self._hits += len(keys) - len(missing)
        self._misses += len(missing)
        if len(missing) == len(keys):  # nothing kept: the tower on the batch itself, its output handed on as is
            self._calls += 1
            vision = backbone.encode_vision(batch)
            for key, entry in zip(keys, _per_unit(vision)):
                self._keep(key, entry)
            return vision
        if missing:  # only then read the device batch's grids (a host sync per image on CUDA)
            units = _units(batch)
            fresh = self._run_tower(backbone, batch, [units[i] for i in missing])
            for i, entry in zip(missing, fresh):
                found[i] = entry
                self._keep(keys[i], entry)
        levels = len(found[0][1])
        return VisionFeatures(
            merged=torch.cat([merged for merged, _ in found]),
            deepstack=tuple(torch.cat([deep[level] for _, deep in found]) for level in range(levels)),
            sizes=[int(merged.shape[0]) for merged, _ in found],
        )

    def _run_tower(self, backbone, batch: Batch, units) -> list[tuple[torch.Tensor, tuple[torch.Tensor, ...]]]:
        """The tower on `units` only (images first, as given), split back per image / video (views)."""
        images = [(p, g) for kind, p, g in units if kind == "image"]
        videos = [(p, g) for kind, p, g in units if kind == "video"]
        sub = replace(
            batch,
            pixel_values=torch.cat([p for p, _ in images]) if images else None,
            image_grid_thw=torch.cat([g for _, g in images]) if images else None,
            pixel_values_videos=torch.cat([p for p, _ in videos]) if videos else None,
            video_grid_thw=torch.cat([g for _, g in videos]) if videos else None,
        )
        self._calls += 1
        return _per_unit(backbone.encode_vision(sub))

    def _keep(self, key: Key, entry) -> None:
        """Keep one unit's features (views into a tower call's output): cloned only when kept, so
        an entry never holds a whole batch's features alive."""
        merged, deepstack = entry
        size = merged.numel() * merged.element_size() + sum(d.numel() * d.element_size() for d in deepstack)
        self._entries.keep(key, size, lambda: (merged.clone(), tuple(d.clone() for d in deepstack)))


class RowKeys:
    """Each pair's keys, hashed as the prep workers serialize it (`hashing`), so the hash of a
    page's patches (~10 ms) is not the model thread's; `of_batch` assembles a batch's keys."""

    def __init__(self, cache: TowerCache) -> None:
        self.cache = cache
        self._rows: dict[int, list[Key]] = {}

    def hashing(self, serialize):
        """`serialize(index) -> (pair, digests or None)` as `serialize(index) -> pair`, also keeping
        the pair's keys under its index (hashed here where `digests` is None)."""

        def run(index: int):
            pair, digests = serialize(index)
            self._rows[index] = self.cache.keys(pair, digests) or []
            return pair

        return run

    def of_batch(self, host_batch: Batch) -> list[Key] | None:
        """The batch's keys in the tower's order (every row's images, then every row's videos, as
        `collate` lays them out); hashed here for a row the workers did not key."""
        if not all(row in self._rows for row in host_batch.rows):
            return self.cache.keys(host_batch)
        per_row = [self._rows.pop(row) for row in host_batch.rows]
        keys = [key for row in per_row for key in row if key[2] == "image"]
        keys += [key for row in per_row for key in row if key[2] == "video"]
        return keys or None

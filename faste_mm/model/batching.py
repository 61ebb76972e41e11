"""Stage 3: batching. Groups serialized items into length-sorted batches under a padded-token
budget and collates each into right-padded tensors.

Receives `Serialized` items; hands on `Batch`es (with the rows they came from) to the runner.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from faste_mm.errors import ConfigError
from faste_mm.model.cpu.machine_plan import BATCH_TOKENS, MachinePlan, machine_plan
from faste_mm.model.serialization import Serialized


# how the layers after compression treat padding (faste_mm.model.unpadded has the kernels)
UNPADDED_MODES = ("auto", "off", "flash-attn", "torch-nested", "segments")

# A batch's tensor bytes when BatchingConfig.batch_bytes is None, by device type. Host memory
# bounds a CPU run (2 pages at the pixel cap); a GPU is fed larger image batches: on an H200, 20
# pages in 3-page batches ran the reranker's forward in 0.87 s, in a 12-page batch 0.65 s
# (docs/benchmarks-log.md, "GPU runs"), and the token budget still caps a batch of pages at ~9-12.
BATCH_BYTES = {"cpu": 96 * 2**20, "cuda": 512 * 2**20}


@dataclass(frozen=True, slots=True)
class BatchingConfig:
    """batch_tokens bounds batch_size * padded_length (None: the machine plan's, `BATCH_TOKENS` for
    the model's device, 4,096 on a CPU, 16,384 on CUDA); max_batch_size bounds the rows of a batch;
    batch_bytes bounds the bytes of a batch's tensors (a page near the pixel cap is ~44 MB of
    float32 patches; None: `BATCH_BYTES` for the model's device, 96 MiB = 2 such pages on a CPU,
    512 MiB on CUDA; an item larger than it is a batch of its own), planned before any page is
    rendered: the batch the model runs, the one prepared meanwhile and the model's own copies of
    its pixels stay the same size however long the document, at the cost of smaller batches of
    large images (a batch of texts is far below it); chunk_items is how many
    items are serialized (and length-sorted together) at a time (the first chunks are smaller,
    so the model starts early); workers preprocess in background
    threads (None = the machine plan's, one per usable CPU core, at most 8; 0 = in the caller, no overlap); at most
    prefetch_batches ready batches wait for the model, and past the first at most prefetch_bytes
    bytes of them (pixels, token ids, positions; the default keeps one batch of large images
    ahead of the model and up to prefetch_batches of texts, ~1 MB each), which bounds host
    memory whatever the item count: images and PDF pages are measured from their headers and
    page boxes and rendered only when their batch is prepared, and the items measuring had to
    serialize (text, video) are kept for their batch within prefetch_bytes too; unpadded: after compression, run the
    remaining layers on packed rows with a variable-length attention kernel ("auto": on CUDA,
    the fastest of padded / flash-attn / torch-nested on a trial batch; "segments" on a CPU),
    "off" (padded), or a kernel by name."""

    batch_tokens: int | None = None
    max_batch_size: int = 64
    batch_bytes: int | None = None
    chunk_items: int = 256
    workers: int | None = None
    prefetch_batches: int = 4
    prefetch_bytes: int = 32 * 2**20
    unpadded: str = "auto"

    @property
    def token_budget(self) -> int:
        """batch_tokens, or the CPU's default where the device is not known (plan_batches alone)."""
        return BATCH_TOKENS["cpu"] if self.batch_tokens is None else self.batch_tokens

    @property
    def byte_budget(self) -> int:
        """batch_bytes, or the CPU's default where the device is not known (plan_batches alone)."""
        return BATCH_BYTES["cpu"] if self.batch_bytes is None else self.batch_bytes

    def machine_plan(self, device: torch.device) -> MachinePlan:
        """The threads and batch budget for `device` on this machine, this config's workers and
        batch_tokens winning over the machine's rule (`machine_plan.machine_plan`)."""
        return machine_plan(device=device.type, workers=self.workers, batch_tokens=self.batch_tokens)

    def for_device(self, device: torch.device, plan: MachinePlan | None = None) -> "BatchingConfig":
        """This config with batch_tokens / workers / batch_bytes None resolved for `device` on
        this machine (what a model's stages use); `plan`: `machine_plan(device)` if already made."""
        plan = plan or self.machine_plan(device)
        return replace(self, batch_tokens=plan.batch_tokens, workers=plan.prep_threads,
                       batch_bytes=BATCH_BYTES[plan.device] if self.batch_bytes is None else self.batch_bytes)

    @property
    def worker_threads(self) -> int:
        """Preprocessing threads: `workers`, or the machine plan's for a CPU (one per usable
        core, at most 8: tokenizers, PIL and the image processor release the GIL)."""
        return self.workers if self.workers is not None else machine_plan().prep_threads

    def __post_init__(self) -> None:
        if self.batch_tokens is not None and (not isinstance(self.batch_tokens, int) or self.batch_tokens < 1):
            raise ConfigError(f"BatchingConfig.batch_tokens must be an int >= 1 or None, got {self.batch_tokens!r}")
        if self.max_batch_size < 1:
            raise ConfigError(f"BatchingConfig.max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.batch_bytes is not None and (not isinstance(self.batch_bytes, int) or self.batch_bytes < 1):
            raise ConfigError(f"BatchingConfig.batch_bytes must be an int >= 1 (bytes) or None, got {self.batch_bytes!r}")
        if self.chunk_items < 1:
            raise ConfigError(f"BatchingConfig.chunk_items must be >= 1, got {self.chunk_items}")
        if self.workers is not None and self.workers < 0:
            raise ConfigError(f"BatchingConfig.workers must be >= 0, got {self.workers}")
        if self.prefetch_batches < 1:
            raise ConfigError(f"BatchingConfig.prefetch_batches must be >= 1, got {self.prefetch_batches}")
        if not isinstance(self.prefetch_bytes, int) or self.prefetch_bytes < 0:
            raise ConfigError(f"BatchingConfig.prefetch_bytes must be an int >= 0 (bytes), got {self.prefetch_bytes!r}")
        if self.unpadded not in UNPADDED_MODES:
            raise ConfigError(f"BatchingConfig.unpadded must be one of {', '.join(UNPADDED_MODES)}; got {self.unpadded!r}")


@dataclass(frozen=True, slots=True)
class Batch:
    """Right-padded model inputs for B items. Row b came from caller position `rows[b]`."""

    rows: list[int]
    input_ids: torch.Tensor  # [B, T]
    valid: torch.Tensor  # [B, T] bool, False on padding
    lengths: torch.Tensor  # [B] valid tokens per row (readout = lengths - 1)
    mm_token_type_ids: torch.Tensor | None = None  # [B, T]
    pixel_values: torch.Tensor | None = None  # [sum P, C] images in row order
    image_grid_thw: torch.Tensor | None = None  # [n_images, 3]
    position_ids: torch.Tensor | None = None  # [3, B, T] MRoPE positions (rows with images)
    image_grids: tuple[tuple[int, int, int], ...] = ()  # image_grid_thw as host ints: FLOPs without a device read
    pixel_values_videos: torch.Tensor | None = None  # [sum P_v, C] videos in row order
    video_grid_thw: torch.Tensor | None = None  # [n_videos, 3]
    video_grids: tuple[tuple[int, int, int], ...] = ()  # video_grid_thw as host ints
    protected: torch.Tensor | None = None  # [B] leading positions per row a compressor must keep (reranker queries)

    @property
    def size(self) -> int:
        return len(self.rows)

    def pin_memory(self) -> "Batch":
        """Page-locked copies so the host-to-device copy can run asynchronously."""
        return self._map(lambda t: t.pin_memory())

    def to(self, device: torch.device) -> "Batch":
        non_blocking = device.type == "cuda"
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def _map(self, fn) -> "Batch":
        """The batch with `fn` applied to every tensor field (host ints and rows stay as they are)."""
        tensors = {f.name: getattr(self, f.name) for f in fields(self)}
        return replace(self, **{name: fn(value) for name, value in tensors.items() if isinstance(value, torch.Tensor)})


def plan_batches(lengths: list[int], config: BatchingConfig, sizes: list[int] | None = None) -> list[list[int]]:
    """Indices grouped into batches, longest first, so padding stays small.

    A batch grows while (rows + 1) * longest <= batch_tokens, rows < max_batch_size and (with
    `sizes`, each item's bytes) its bytes stay within batch_bytes; an item over a budget still
    gets a batch of its own.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    held = 0  # bytes of `current`
    for index in order:
        longest = lengths[current[0]] if current else lengths[index]
        size = 0 if sizes is None else sizes[index]
        fits = ((len(current) + 1) * longest <= config.token_budget and len(current) < config.max_batch_size
                and held + size <= config.byte_budget)
        if current and not fits:
            batches.append(current)
            current, held = [], 0
        current.append(index)
        held += size
    if current:
        batches.append(current)
    return batches


def collate(items: list[Serialized], rows: list[int], pad_token_id: int, release: bool = False) -> Batch:
    """Right-pad token ids; concatenate the images' and the videos' patches in row order.

    release: replace each entry of `items` by a copy without pixels as soon as its patches are in
    the batch, so collating costs the batch's bytes plus one item's, not twice the batch's (the
    caller must hold no other reference to the items for their memory to go).
    """
    lengths = torch.tensor([item.length for item in items], dtype=torch.long)
    width = int(lengths.max())
    input_ids = torch.full((len(items), width), pad_token_id, dtype=torch.long)
    valid = torch.arange(width)[None, :] < lengths[:, None]  # [B, T]
    has_mm = any(item.mm_token_type_ids is not None for item in items)
    mm_types = torch.zeros((len(items), width), dtype=torch.long) if has_mm else None
    for b, item in enumerate(items):
        input_ids[b, : item.length] = item.input_ids
        if mm_types is not None and item.mm_token_type_ids is not None:
            mm_types[b, : item.length] = item.mm_token_type_ids
    position_ids = None
    if any(item.position_ids is not None for item in items):
        # rows without their own (text-only) count 0..T-1 on all three axes; padding is never attended
        position_ids = torch.arange(width).expand(3, len(items), width).clone()
        for b, item in enumerate(items):
            if item.position_ids is not None:
                position_ids[:, b, : item.length] = item.position_ids
    images = [item.image_grid_thw for item in items if item.image_grid_thw is not None]
    grids = torch.cat(images) if images else None
    videos = [item.video_grid_thw for item in items if item.video_grid_thw is not None]
    video_grids = torch.cat(videos) if videos else None
    pixel_values = _concat_patches(items, "pixel_values", release)
    pixel_values_videos = _concat_patches(items, "pixel_values_videos", release)
    return Batch(
        rows=list(rows),
        input_ids=input_ids,
        valid=valid,
        lengths=lengths,
        mm_token_type_ids=mm_types,
        pixel_values=pixel_values,
        image_grid_thw=grids,
        position_ids=position_ids,
        image_grids=() if grids is None else tuple(tuple(g) for g in grids.tolist()),
        pixel_values_videos=pixel_values_videos,
        video_grid_thw=video_grids,
        video_grids=() if video_grids is None else tuple(tuple(g) for g in video_grids.tolist()),
        protected=torch.tensor([item.protected for item in items]) if any(item.protected for item in items) else None,
    )


def _concat_patches(items: list[Serialized], name: str, release: bool) -> torch.Tensor | None:
    """The `name` patches ([P, C]) of `items` concatenated in row order (torch.cat's result);
    with `release`, each item is replaced by a copy without them once they are copied."""
    parts = [getattr(item, name) for item in items if getattr(item, name) is not None]
    if not parts or not release:
        return torch.cat(parts) if parts else None
    out = torch.empty((sum(p.shape[0] for p in parts), *parts[0].shape[1:]), dtype=parts[0].dtype)  # [sum P, C]
    del parts
    start = 0
    for b, item in enumerate(items):
        patches = getattr(item, name)
        if patches is not None:
            out[start : start + patches.shape[0]] = patches
            start += patches.shape[0]
            items[b] = replace(item, **{name: None})
    return out

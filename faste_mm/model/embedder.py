"""The public embedding API. `Embedder` composes the stages: expand items -> serialize ->
length-sorted batches -> runner with a compressor policy -> pooled unit vectors in input order,
with per-batch stats (trigger layer, tokens kept, realised and full FLOPs, timings).
"""

from __future__ import annotations

import logging
import time
from os import PathLike
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Iterator, Literal

import numpy as np
import torch

from faste_mm.model.backbones.loading import LoadedModel, load_model
from faste_mm.model.batching import Batch, BatchingConfig
from faste_mm.model.ablations import policy_for
from faste_mm.model.faste import FastEConfig
from faste_mm.errors import ConfigError, InputError
from faste_mm.model.flops import (DecoderShape, batch_flops, flops_reduction, full_batch_flops, tower_share, vision_flops)
from faste_mm.model.cost import CostTally
from faste_mm.model.official import QUERY_INSTRUCTION
from faste_mm.model.items import Failure, Item, expand_items, failure_reason
from faste_mm.model.cpu.machine_plan import use_torch_threads
from faste_mm.model.patch_dedup import PatchDedupConfig, PixelNorm, applies_to, drop_repeated_units
from faste_mm.model.pooling import truncate_dim
from faste_mm.model.prefetch import ItemError, PrepTimer, prefetch_batches
from faste_mm.model.runner import BatchTrace, run_decoder, settle_kernel
from faste_mm.model.serialization import MERGE_UNIT, SerializerConfig, Serialized, TextPrompt
from faste_mm.model.unpadded import Unpadded

log = logging.getLogger(__name__)

OnError = Literal["raise", "skip"]
# Python advice on an item that stopped a call; the CLI skips bad items and names each itself.
SKIP_HINT = "or pass on_error='skip' to embed the other inputs"


@dataclass(frozen=True, slots=True)
class EmbedStats(CostTally):
    """Totals over one `encode` call: its `CostTally` (prefix tokens, tower and decoder seconds) and
    more. FLOPs follow docs/design.md's formulas over the same batches."""

    n_items: int
    n_failed: int
    batches: list[BatchTrace]
    shape: DecoderShape
    fast_e: dict | None
    serialize_s: float  # worker seconds spent reading, decoding, resizing, tokenizing (overlapped)
    forward_s: float  # model seconds in the caller's thread
    elapsed_s: float  # the whole call, wall time
    flops_full: int = 0
    flops_realised: int = 0
    flops_vision: int = 0  # the vision tower's, the same with and without FastE
    attention_trial: dict = field(default_factory=dict)  # Unpadded.trial: seconds (or why not) per option
    dtype: dict = field(default_factory=dict)  # DtypeChoice.to_dict(): the dtype the model ran in, and why
    kernels: list[str] = field(default_factory=list)  # kernel_choice verdicts, e.g. "tower attention: bfloat16, measured 2.6x ..."

    @property
    def flops_reduction(self) -> float:
        return flops_reduction(self.flops_realised, self.flops_full)

    @property
    def flops_reduction_with_vision(self) -> float:
        """The whole forward's: what FastE can save where the vision tower runs too."""
        return flops_reduction(self.flops_realised + self.flops_vision, self.flops_full + self.flops_vision)

    @property
    def tower_flops_share(self) -> float:
        """The vision tower's share of the FLOPs this run realised (decoder after FastE + tower)."""
        return tower_share(self.flops_vision, self.flops_realised)

    @property
    def attention(self) -> dict[str, int]:
        """Batches per attention layout after compression ("padded" or the unpadded kernel)."""
        counts: dict[str, int] = {}
        for trace in self.batches:
            if trace.trigger_layer is not None:
                counts[trace.attention] = counts.get(trace.attention, 0) + 1
        return counts

    def patch_shares(self) -> dict[int, float]:
        """Item row -> the share of its image's patches the tower saw, for every embedded item
        whose image duplicate-patch removal looked at."""
        return {row: kept / total for trace in self.batches
                for row, (kept, total) in zip(trace.rows, trace.patch_units) if total}

    @property
    def mean_trigger_layer(self) -> float | None:
        layers = [trace.trigger_layer for trace in self.batches if trace.trigger_layer is not None]
        return sum(layers) / len(layers) if layers else None

    def to_dict(self) -> dict:
        return {
            "n_items": self.n_items,
            "n_failed": self.n_failed,
            "fast_e": self.fast_e,
            "prefix_tokens": self.prefix_tokens,
            "kept_prefix_tokens": self.kept_prefix_tokens,
            "prefix_removal": self.prefix_removal,
            "flops_full": self.flops_full,
            "flops_realised": self.flops_realised,
            "flops_reduction": self.flops_reduction,
            "flops_vision": self.flops_vision,
            "flops_reduction_with_vision": self.flops_reduction_with_vision,
            "mean_trigger_layer": self.mean_trigger_layer,
            "image_units": self.image_units,
            "kept_image_units": self.kept_image_units,
            "patches_kept": self.patches_kept,
            "attention": self.attention,
            "attention_trial": self.attention_trial,
            "serialize_s": self.serialize_s,
            "forward_s": self.forward_s,
            "tower_s": self.tower_s,
            "decoder_s": self.decoder_s,
            "tower_time_share": self.tower_share,
            "tower_flops_share": self.tower_flops_share,
            "dtype": self.dtype,
            "kernels": self.kernels,
            "elapsed_s": self.elapsed_s,
            "shape": self.shape.to_dict(),
            "batches": [trace.to_dict() for trace in self.batches],
        }


@dataclass(frozen=True, slots=True)
class EmbedResult:
    """Rows follow the expanded inputs (a PDF contributes one row per page), in input order.

    embeddings: float32 [n, d], unit norm; rows of failed items are all zero and `ok` is False.
    """

    embeddings: np.ndarray
    items: list[Item]
    sources: list[int]
    ok: np.ndarray
    failures: list[Failure] = field(default_factory=list)
    stats: EmbedStats | None = None


class Embedder:
    """Qwen3-VL-Embedding (or a supported text embedding model) with optional FastE.

    Example:
        >>> emb = Embedder.from_pretrained("Qwen/Qwen3-VL-Embedding-2B")
        >>> res = emb.encode(["a red bicycle", Item(image="photo.jpg")], fast_e=FastEConfig(r_max=0.5))
        >>> res.embeddings.shape  # (2, 2048)
    """

    def __init__(self, loaded: LoadedModel, batching: BatchingConfig | None = None) -> None:
        self.loaded = loaded
        self.backbone = loaded.backbone
        self.serializer = loaded.serializer
        self.family = loaded.family
        batching = batching or BatchingConfig()
        # threads and batch budget for this machine's usable cores (the caller's settings win)
        self.machine = batching.machine_plan(self.backbone.device)
        self.batching = batching.for_device(self.backbone.device, self.machine)
        use_torch_threads(self.machine)
        # settled once per Embedder (the "auto" trial runs on the first compressed batch: settle_kernel)
        self.unpadded = Unpadded(self.batching.unpadded, self.backbone.device, self.backbone.dtype)
        self._warned_warmup: set[int] = set()  # warm-up layers past the depth already warned about

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | PathLike,
        *,
        device: str | torch.device = "auto",
        dtype: str | torch.dtype = "auto",
        revision: str | None = None,
        batching: BatchingConfig | None = None,
        serializer: SerializerConfig | None = None,
        prompt: TextPrompt | None = None,
        attn_implementation: str = "sdpa",
    ) -> "Embedder":
        """Load a hub id (e.g. "Qwen/Qwen3-VL-Embedding-2B") or a local directory.

        device "auto" picks CUDA when available, else the CPU; dtype "auto" runs bfloat16 on CUDA
        and on CPUs with native bfloat16 (`loading.choose_dtype`; `dtype_choice` says which and
        why), float32 elsewhere. `prompt` overrides
        the text template / readout rule of text models. Raises ModelLoadError.
        """
        loaded = load_model(
            name_or_path,
            device=device,
            dtype=dtype,
            revision=revision,
            serializer=serializer,
            prompt=prompt,
            attn_implementation=attn_implementation,
        )
        return cls(loaded, batching)

    @property
    def model_id(self) -> str:
        return self.loaded.model_id

    @property
    def dtype_choice(self):
        """`DtypeChoice`: the dtype the model runs in, and why."""
        return self.loaded.dtype_choice

    @property
    def dim(self) -> int:
        return self.backbone.embedding_dim

    def with_serializer(self, config: SerializerConfig) -> "Embedder":
        """The same weights with other image/length settings (e.g. a lower max_pixels)."""
        prompt = getattr(self.serializer, "prompt", None)
        new = self.family.serializer(self.loaded.preprocessor, config, prompt)
        return Embedder(replace(self.loaded, serializer=new), self.batching)

    def with_batching(self, config: BatchingConfig) -> "Embedder":
        """The same weights with other batching (token budget, workers, unpadded attention)."""
        return Embedder(self.loaded, config)

    def resolve_fast_e(self, fast_e: FastEConfig | None) -> FastEConfig | None:
        """Fill backbone defaults (l_w, theta) into a config; None stays None (full forward).
        Logs a warning (once per value) for a warm-up layer at or past the model's depth."""
        if fast_e is None:
            return None
        num_layers = self.backbone.shape.num_layers
        if fast_e.warmup_layer is not None and fast_e.warmup_layer >= num_layers and fast_e.trigger_layer is None:
            if fast_e.warmup_layer not in self._warned_warmup:
                self._warned_warmup.add(fast_e.warmup_layer)
                log.warning("FastE warm-up layer %d (l_w, --warmup-layer) is past the last layer of %s (%d layers, "
                            "0..%d): only the last layer is checked, so FastE compresses before layer %d; give a "
                            "warm-up layer below %d", fast_e.warmup_layer, self.model_id, num_layers, num_layers - 1,
                            num_layers - 1, num_layers)
        return fast_e.resolved(self.family, num_layers)

    def encode(
        self,
        inputs: object | Iterable[object],
        *,
        fast_e: FastEConfig | None = None,
        instruction: str | None = None,
        dim: int | None = None,
        on_error: OnError = "raise",
        record_alignment: bool = False,
        progress: Callable[[int], None] | None = None,
        on_batch: Callable[[BatchTrace], None] | None = None,
        patch_dedup: PatchDedupConfig | None = None,
    ) -> EmbedResult:
        """Embed texts, images, image+text pairs and PDF pages.

        Args:
            inputs: str (text), Path/PIL image, or `Item`, or an iterable of them: a lone input is
                one row, like a list of one (a str is never embedded character by character);
                PDF paths expand to one row per page.
            fast_e: FastE settings, or None for the full forward.
            instruction: used for items without their own; None means the model's document format.
            dim: Matryoshka truncation (re-normalised); None keeps all dimensions.
            on_error: "raise" stops at the first bad item (InputError naming it); "skip" embeds the
                rest and reports failures in the result.
            record_alignment: with the full forward, measure the batch-mean readout/prefix
                alignment before every layer (stats.batches[i].alignment), for calibration.
            progress: called with the number of rows done after each batch (and each failure).
            on_batch: called with each batch's `BatchTrace` (rows, prefix tokens before and
                after FastE) as soon as it is embedded, before `progress`: live rates.
            patch_dedup: drop repeated merge units of PDF pages and screenshot-like images before
                the vision tower (faste_mm.model.patch_dedup); None or mode "off" keeps them all.
                `stats.patch_shares()` gives each image's kept share.
        """
        if on_error not in ("raise", "skip"):
            raise ConfigError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        started = time.perf_counter()
        resolved = self.resolve_fast_e(fast_e)
        policy = policy_for(resolved, self.backbone.shape.num_layers, record_alignment)
        items, sources, broken = expand_items(inputs)
        failures = [Failure(index, sources[index], item.describe(), reason) for index, item, reason in broken]
        if failures and on_error == "raise":
            raise InputError(f"input {failures[0].source}: {failures[0].reason}", hint=SKIP_HINT)
        if failures and progress is not None:
            progress(len(failures))
        embeddings = np.zeros((len(items), self.dim), dtype=np.float32)
        ok = np.zeros(len(items), dtype=bool)
        traces: list[BatchTrace] = []
        forward_s = 0.0
        broken_rows = {failure.index for failure in failures}
        todo = [i for i in range(len(items)) if i not in broken_rows]
        timer = PrepTimer()
        device = self.backbone.device
        for element in self.prepare_batches(items, todo, instruction, timer, patch_dedup):
            if isinstance(element, ItemError):
                failure = item_failure(items, sources, element)
                if on_error == "raise":
                    raise InputError(f"input {failure.source}: {failure.reason}", hint=SKIP_HINT) from element.error
                failures.append(failure)
                if progress is not None:
                    progress(1)
                continue
            batch = element.to(device)
            kernel = settle_kernel(self.backbone, batch, policy, self.unpadded)
            tick = time.perf_counter()
            vectors, trace = run_decoder(self.backbone, batch, policy, kernel)
            vectors = truncate_dim(vectors, dim).cpu().numpy()  # .cpu() waits for the GPU: honest timing
            forward_s += time.perf_counter() - tick
            embeddings[element.rows, : vectors.shape[1]] = vectors
            ok[element.rows] = True
            traces.append(trace)
            if on_batch is not None:
                on_batch(trace)
            if progress is not None:
                progress(len(element.rows))
            del element, batch  # freed before the next batch is fetched, not after: one batch fewer alive
        if dim is not None:
            embeddings = np.ascontiguousarray(embeddings[:, :dim])
        failures.sort(key=lambda f: f.index)
        if failures:
            log.info("embedded %d items, skipped %d", int(ok.sum()), len(failures))
        stats = self._stats(traces, len(items), len(failures), resolved, timer.seconds, forward_s, started)
        return EmbedResult(embeddings, items, sources, ok, failures, stats)

    def prepare_batches(
        self, items: list[Item], rows: list[int], instruction: str | None = None, timer: PrepTimer | None = None,
        patch_dedup: PatchDedupConfig | None = None,
    ) -> Iterator[Batch | ItemError]:
        """Serialize items[rows] and group them into host `Batch`es exactly as `encode` does (same
        batches, same order; worker threads run ahead of the caller), with an `ItemError` for each
        item that cannot be serialized. For callers that run several policies on each batch
        (calibration) without serializing the items again."""
        dedup = patch_dedup if patch_dedup is not None and patch_dedup.is_on else None
        norm = None if dedup is None else PixelNorm.of(self.loaded.preprocessor.image_processor)

        def serialize(index: int) -> Serialized:
            item = items[index]
            serialized = self.backbone.with_positions(self.serializer(item, item.instruction or instruction))
            if dedup is not None and applies_to(item):  # after the positions: they are the full sequence's
                serialized = drop_repeated_units(serialized, dedup, norm, self.backbone.image_token_id)
            return serialized

        def measure(index: int) -> tuple[int, int] | None:  # tokens and bytes, without pixels where it can be
            return self.serializer.planned_size(items[index], items[index].instruction or instruction)

        pin = self.backbone.device.type == "cuda"
        return prefetch_batches(rows, serialize, self.batching, self.loaded.pad_token_id, pin, timer, measure)

    def encode_queries(
        self,
        inputs: object | Iterable[object],
        *,
        instruction: str | None = None,
        fast_e: FastEConfig | None = None,
        dim: int | None = None,
        on_error: OnError = "raise",
        progress: Callable[[int], None] | None = None,
    ) -> EmbedResult:
        """Queries: the task instruction (None: the official query instruction,
        `instructions.QUERY_INSTRUCTION`, for vision-language models; a text model's own default
        query task) and the full forward unless `fast_e` is given."""
        prompt = getattr(self.serializer, "prompt", None)
        if instruction is None:
            instruction = prompt.default_query_instruction if prompt is not None else QUERY_INSTRUCTION
        return self.encode(inputs, fast_e=fast_e, instruction=instruction, dim=dim, on_error=on_error, progress=progress)

    def encode_documents(
        self,
        inputs: object | Iterable[object],
        *,
        fast_e: FastEConfig | None = None,
        dim: int | None = None,
        on_error: OnError = "raise",
        record_alignment: bool = False,
        progress: Callable[[int], None] | None = None,
        on_batch: Callable[[BatchTrace], None] | None = None,
        patch_dedup: PatchDedupConfig | None = None,
    ) -> EmbedResult:
        """Documents / candidates: the default instruction (document format); FastE and
        duplicate-patch removal if given."""
        return self.encode(
            inputs, fast_e=fast_e, instruction=None, dim=dim, on_error=on_error,
            record_alignment=record_alignment, progress=progress, on_batch=on_batch, patch_dedup=patch_dedup,
        )

    def encode_query(self, inputs: object, *, instruction: str | None = None, fast_e: FastEConfig | None = None,
                     dim: int | None = None, on_error: OnError = "raise") -> EmbedResult:
        """`encode_queries` under the sentence-transformers name. One input (a str, path, PIL
        image or `Item`) counts as a list of one, so `encode_query("a red bicycle")` embeds the
        sentence, not its characters; the result is the same `EmbedResult`."""
        return self.encode_queries(inputs, instruction=instruction, fast_e=fast_e, dim=dim, on_error=on_error)

    def encode_document(self, inputs: object, *, fast_e: FastEConfig | None = None, dim: int | None = None,
                        on_error: OnError = "raise") -> EmbedResult:
        """`encode_documents` under the sentence-transformers name (one input or many, as
        `encode_query`)."""
        return self.encode_documents(inputs, fast_e=fast_e, dim=dim, on_error=on_error)

    def _stats(self, traces, n_items, n_failed, resolved, serialize_s, forward_s, started) -> EmbedStats:
        shape = self.backbone.shape
        return EmbedStats(
            n_items=n_items,
            n_failed=n_failed,
            batches=traces,
            shape=shape,
            fast_e=None if resolved is None else resolved.to_dict(),
            serialize_s=serialize_s,
            forward_s=forward_s,
            elapsed_s=time.perf_counter() - started,
            flops_full=sum(full_batch_flops(shape, t.batch_size, t.padded_lengths[0]) for t in traces),
            flops_realised=sum(batch_flops(shape, t.batch_size, t.padded_lengths) for t in traces),
            flops_vision=self._vision_flops(traces),
            attention_trial=dict(self.unpadded.trial),
            **CostTally.total(traces).cost_fields(),
            dtype=self.loaded.dtype_choice.to_dict(),
            kernels=self.kernel_choices(),
        )

    def describe_runtime(self) -> str:
        """The dtype and the machine plan's threads in one line, e.g. "float32; threads: torch 2, ..."
        (what a command says once; the kernel choices are in `kernel_choices` and the debug log)."""
        return f"{self.loaded.dtype_choice.name}; {self.machine.describe()}"

    def kernel_choices(self) -> list[str]:
        """The machine plan's threads and batch budget, then the CPU kernel choices settled so
        far (`kernel_choice.KernelTrials`), in words."""
        tower = getattr(self.backbone, "tower", None)
        return [self.machine.describe(), *(tower.trials.describe() if tower is not None else []),
                *self.backbone.mlp.trials.describe()]

    def _vision_flops(self, traces) -> int:
        vision = self.backbone.vision_shape
        return 0 if vision is None else sum(vision_flops(vision, tower_grids(t) + t.video_grids) for t in traces)


def tower_grids(trace: BatchTrace) -> list[tuple[int, int, int]]:
    """The images' grids as the tower ran them: an image that dropped repeated units attends over
    its kept patches only, which `vision_flops` counts as a frame of 1 x (kept patches)."""
    if len(trace.tower_units) != len(trace.image_grids):  # traces without per-image units (a reranker's)
        return list(trace.image_grids)
    return [grid if units * MERGE_UNIT == grid[0] * grid[1] * grid[2] else (1, units * MERGE_UNIT, 1)
            for grid, units in zip(trace.image_grids, trace.tower_units)]


def item_failure(items: list[Item], sources: list[int], error: ItemError) -> Failure:
    """The `Failure` of an item whose serialization raised; the reason names the item."""
    item = items[error.index]
    return Failure(error.index, sources[error.index], item.describe(), failure_reason(item, error.error))

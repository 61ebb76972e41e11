"""Stage 4: the runner. One explicit loop over decoder layers: before each layer it asks the
policy (`faste.FastE`, or `ablations.Full`) for a decision and, if it gets a keep plan, applies it
with one gather and rebuilds the 4-D mask (or packs the rows for the given unpadded kernel); then
it runs the layer (and DeepStack). It records the realised shapes. Which kernel, if any, is
settled before the loop by `settle_kernel`. On CUDA it queues each checked layer before the host
reads the policy's alignment (`look_ahead`), so the check never leaves the device idle.

Receives a `Batch`; hands on pooled unit vectors [B, H] and a `BatchTrace`.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import torch

from faste_mm.model.batching import Batch
from faste_mm.model.cost import CostTally
from faste_mm.model.decoder_state import DecoderState
from faste_mm.model.cpu.machine_plan import check_threads
from faste_mm.model.pooling import pool_readout
from faste_mm.model.unpadded import PADDED, PackedKernel, Unpadded


@dataclass(frozen=True, slots=True)
class BatchTrace(CostTally):
    """What happened to one batch: shapes for FLOPs, where it compressed, what it kept, and the
    seconds of its two stages (vision tower, decoder): a `CostTally` of one batch."""

    batch_size: int
    rows: list[int]  # the caller's item index of each batch row
    padded_lengths: list[int]  # padded tokens per row entering each layer
    trigger_layer: int | None  # layer before which the batch was compressed
    alignment: list[tuple[int, float]] = field(default_factory=list)  # (layer, batch-mean g) measured
    attention: str = PADDED  # the layers after compression: "padded" or the unpadded kernel's name
    image_grids: list[tuple[int, int, int]] = field(default_factory=list)  # (t, h, w) patches per image
    video_grids: list[tuple[int, int, int]] = field(default_factory=list)  # (frame pairs, h, w) per video

    def to_dict(self) -> dict:
        return asdict(self)


@torch.inference_mode()
def run_decoder(
    backbone, batch: Batch, policy, kernel: PackedKernel | None = None, readout=pool_readout, encode_vision=None,
    look_ahead: bool | None = None,
) -> tuple[torch.Tensor, BatchTrace]:
    """Embed one batch; returns ([B, H] float32 unit vectors in batch row order, trace).

    `kernel`: run the layers after compression on packed rows with it (when the backbone can
    pack rows that wide); None keeps them padded. `readout(backbone, [B, H] pre-norm readout
    states)` turns the last tokens into the output: pooled vectors, or a reranker's scores [B].
    `encode_vision(batch)` stands in for the backbone's tower (a reranker's `TowerCache`).
    `look_ahead`: for policies that measure before they decide (`FastE`), queue each checked
    layer on the uncompressed state before the host reads the alignment, and discard it at the
    one layer that fires (`reads_ahead`); None = on CUDA only. The decisions and vectors are the same.
    """
    started = time.perf_counter()
    vision = (encode_vision or backbone.encode_vision)(batch)  # the tower: its own timed stage
    tower_s = 0.0 if vision is None else elapsed_s(started, batch.input_ids.device)
    started = time.perf_counter()
    state = backbone.embed(batch, vision)
    masks = backbone.attention_masks(state)
    width = int(state.hidden.shape[1])  # padded tokens per row (packed rows: the longest)
    prefix_tokens = state.lengths - 1
    kept_prefix = prefix_tokens
    padded_lengths: list[int] = []
    alignment: list[tuple[int, float]] = []
    trigger_layer = None
    packed = None  # the kernel the layers after compression run with (None: padded)
    look_ahead = reads_ahead(policy, state.hidden.device, look_ahead)
    measures = hasattr(policy, "measure")  # asked in two steps: the check, then the decision
    last = len(backbone.layers) - 1
    for layer in range(len(backbone.layers)):
        output = None  # this layer run on the uncompressed state before the decision was read
        if trigger_layer is None:  # one shot: no decisions after the compression
            if measures:
                with check_threads(state.hidden.device):
                    reading = policy.measure(layer, state)
                # never before the last layer: FastE always compresses there (Algorithm 1's fallback)
                if look_ahead and reading is not None and layer < last:
                    output = step_layer(backbone, layer, state, masks, packed)
                decision = policy.decide(layer, state, backbone, reading)
            else:
                decision = policy.before_layer(layer, state, backbone)
            if decision.alignment is not None:
                alignment.append((layer, decision.alignment))
            if decision.plan is not None:
                output = None  # it saw the states the plan removes: run again on the kept ones
                state = state.gather(decision.plan.index, decision.plan.lengths)
                kept_prefix = decision.plan.lengths - 1
                trigger_layer = layer
                width = int(state.hidden.shape[1])
                state, masks, packed = compressed_layout(backbone, state, kernel)
        padded_lengths.append(width)
        state = output if output is not None else step_layer(backbone, layer, state, masks, packed)
    embeddings = readout(backbone, state.readout_hidden())
    decoder_s = elapsed_s(started, embeddings.device)
    trace = BatchTrace(
        batch_size=batch.size,
        rows=list(batch.rows),
        padded_lengths=padded_lengths,
        trigger_layer=trigger_layer,
        prefix_tokens=int(prefix_tokens.sum()),
        kept_prefix_tokens=int(kept_prefix.sum()),
        alignment=alignment,
        attention=PADDED if packed is None else packed.name,
        image_grids=list(batch.image_grids),
        video_grids=list(batch.video_grids),
        tower_s=tower_s,
        decoder_s=decoder_s,
    )
    return embeddings, trace


def reads_ahead(policy, device: torch.device, look_ahead: bool | None) -> bool:
    """Whether the loop queues a checked layer before reading the policy's alignment: for policies
    that split the question into `measure` and `decide` (`faste.FastE`, `ablations.AlignmentProbe`),
    where asked, else on CUDA. There a host read before each layer left the GPU idle while the
    host waited and then queued the layer: FastE by alignment that never fired ran the photo
    decoder 31% slower on an H200 (docs/benchmarks-log.md, "First GPU run"). Ahead, the host waits
    while the GPU runs the queued layer; the price is one layer run twice, at the layer that fires.
    On a CPU every op finishes before the host goes on: nothing overlaps, and that layer is lost."""
    if not hasattr(policy, "measure"):
        return False
    return device.type == "cuda" if look_ahead is None else look_ahead


def elapsed_s(started: float, device: torch.device) -> float:
    """Seconds since `started`, once the device's queued work is done (CUDA runs asynchronously:
    one synchronisation per stage per batch, so the tower/decoder split is true)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - started


def settle_kernel(backbone, batch: Batch, policy, unpadded: Unpadded | None) -> PackedKernel | None:
    """The unpadded kernel for `batch`'s layers after compression, settled once per `Unpadded`:
    "auto" on CUDA times the candidates on the first batch a compressing policy sees."""
    if unpadded is None or not policy.compresses:
        return None
    return unpadded.settle(lambda kernel: run_decoder(backbone, batch, policy, kernel)[0])


def step_layer(backbone, layer: int, state, masks, kernel: PackedKernel | None):
    """One decoder layer (padded with the 4-D mask, or packed with `kernel`), then DeepStack."""
    if kernel is None:
        hidden = backbone.run_layer(layer, state, masks)
    else:
        hidden = backbone.run_layer_packed(layer, state, kernel.attend)
    return backbone.after_layer(layer, state.with_hidden(hidden))


def compressed_layout(backbone, state: DecoderState, kernel: PackedKernel | None):
    """A just-compressed state as the remaining layers take it: (state, masks, the kernel they run
    with). Packed for `kernel` when the backbone can pack rows that wide (no masks), else padded
    with its 4-D masks rebuilt (only here, from the gathered 2-D mask) and no kernel."""
    if kernel is None or not backbone.can_pack(int(state.hidden.shape[1])):
        return state, backbone.attention_masks(state), None
    return state.pack(), None, kernel

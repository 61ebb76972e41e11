"""What FastE's alignment check costs when it does not fire: on the first batch of the bench's
inputs, the check (`faste.batch_alignment` and the host read of its value, as `FastE.before_layer`
runs it before every monitored layer) against one decoder layer at the first monitored layer,
timed in mirrored rounds in one process. The bench reports seconds per monitored layer and the share.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import torch

from faste_mm.model.faste import batch_alignment, first_checked_layer
from faste_mm.model.items import expand_items
from faste_mm.model.runner import elapsed_s, step_layer


@dataclass(frozen=True, slots=True)
class CheckCost:
    check_s: float  # median seconds of one check (alignment + host read)
    layer_s: float  # median seconds of the decoder layer it precedes
    layer: int
    tokens: int  # padded tokens of the batch (B x T)
    rounds: int

    @property
    def share(self) -> float:
        """The check's seconds over the layer's (the target is <= 2%)."""
        return self.check_s / self.layer_s if self.layer_s else 0.0

    def to_dict(self) -> dict:
        return {**asdict(self), "share": self.share}


@torch.inference_mode()
def measure_check_cost(embedder, inputs: list, rounds: int = 5) -> CheckCost | None:
    """Mirrored rounds (check, layer, layer, check, ...) on the first batch; None when the
    inputs give no batch."""
    items, _, _ = expand_items(inputs)
    batch = next((b for b in embedder.prepare_batches(items, list(range(len(items)))) if hasattr(b, "rows")), None)
    if batch is None:
        return None
    backbone = embedder.backbone
    batch = batch.to(backbone.device)
    state = backbone.embed(batch, backbone.encode_vision(batch))
    masks = backbone.attention_masks(state)
    layer = first_checked_layer(embedder.family.warmup_layer, len(backbone.layers))
    device = state.hidden.device

    def check() -> float:
        started = time.perf_counter()
        float(batch_alignment(state))  # the host read FastE makes to decide
        return time.perf_counter() - started

    def run_layer() -> float:
        started = time.perf_counter()
        step_layer(backbone, layer, state, masks, None)
        return elapsed_s(started, device)

    check(), run_layer()  # warm-up
    checks, layers = [], []
    for round_ in range(rounds):
        first, second = (check, run_layer) if round_ % 2 == 0 else (run_layer, check)
        for measure in (first, second):
            (checks if measure is check else layers).append(measure())
    return CheckCost(statistics.median(checks), statistics.median(layers), layer, int(state.hidden.shape[0] * state.hidden.shape[1]), rounds)

"""What FastE's alignment check costs when it does not fire, on the first batch of the bench's
inputs, per monitored layer and as a share of one decoder layer, timed in mirrored rounds:

- the check alone (`faste.batch_alignment` and the host read of its value) against the decoder
  layer at the first monitored layer. On a CPU every op finishes before the host goes on, so
  this is what the check adds to the forward.
- the whole decoder checked before every layer (`ablations.AlignmentProbe`, which never
  compresses) against the full decoder, with the value read before the layer is queued ("sync",
  the runner before look-ahead) and after ("look-ahead", `runner.reads_ahead`): (checked - full)
  per layer. On CUDA the check costs what it keeps the device from doing, which only this shows.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch

from faste_mm.model.ablations import AlignmentProbe, Full
from faste_mm.model.faste import batch_alignment, first_checked_layer
from faste_mm.model.items import expand_items
from faste_mm.model.runner import run_decoder, step_layer

# how the runner reads a check's value: before queuing the layer, or after (run_decoder's look_ahead)
READS = {"sync": False, "look-ahead": True}


@dataclass(frozen=True, slots=True)
class CheckCost:
    check_s: float  # seconds the check adds to a monitored layer the runner's way on this device
    layer_s: float  # seconds of one decoder layer
    layer: int  # the first monitored layer (where the check alone is timed)
    tokens: int  # padded tokens of the batch (B x T)
    rounds: int
    alone_s: float = 0.0  # median seconds of the check alone, host read included
    decoder_s: dict = field(default_factory=dict)  # the whole decoder: "full", and checked per READS
    per_layer_s: dict = field(default_factory=dict)  # per READS: (checked - full) / layers

    @property
    def share(self) -> float:
        """The check's seconds over the layer's (the target is <= 2%)."""
        return self.check_s / self.layer_s if self.layer_s else 0.0

    def to_dict(self) -> dict:
        return {**asdict(self), "share": self.share}


@torch.inference_mode()
def measure_check_cost(embedder, inputs: list, rounds: int = 5, whole_decoder: bool | None = None) -> CheckCost | None:
    """Mirrored rounds on the first batch; None when the inputs give no batch. whole_decoder:
    also time the decoder checked and not (None: on CUDA, where it is the check's cost; on a CPU
    it costs three forwards a round and the check alone says the same)."""
    items, _, _ = expand_items(inputs)
    batch = next((b for b in embedder.prepare_batches(items, list(range(len(items)))) if hasattr(b, "rows")), None)
    if batch is None:
        return None
    backbone = embedder.backbone
    batch = batch.to(backbone.device)
    vision = backbone.encode_vision(batch)
    state = backbone.embed(batch, vision)
    masks = backbone.attention_masks(state)
    layer = first_checked_layer(embedder.family.warmup_layer, len(backbone.layers))
    device = state.hidden.device
    tokens = int(state.hidden.shape[0] * state.hidden.shape[1])
    single = _mirrored({
        "check": lambda: float(batch_alignment(state)),  # the host read FastE decides by
        "layer": lambda: step_layer(backbone, layer, state, masks, None),
    }, rounds, device)
    alone_s, layer_s = (statistics.median(seconds) for seconds, _ in single.values())
    if not (device.type == "cuda" if whole_decoder is None else whole_decoder):
        return CheckCost(alone_s, layer_s, layer, tokens, rounds, alone_s)

    def decoder(policy, look_ahead: bool = False):
        return lambda: run_decoder(backbone, batch, policy, encode_vision=lambda _: vision, look_ahead=look_ahead)[1]

    runs = {"full": decoder(Full()), **{name: decoder(AlignmentProbe(), ahead) for name, ahead in READS.items()}}
    timed = _mirrored(runs, rounds, device)
    decoder_s = {name: statistics.median(trace.decoder_s for trace in traces) for name, (_, traces) in timed.items()}
    layers = len(backbone.layers)
    per_layer_s = {name: (decoder_s[name] - decoder_s["full"]) / layers for name in READS}
    if device.type != "cuda":  # synchronous: the check alone is its cost, and the layer timed alone
        return CheckCost(alone_s, layer_s, layer, tokens, rounds, alone_s, decoder_s, per_layer_s)
    return CheckCost(per_layer_s["look-ahead"], decoder_s["full"] / layers, layer, tokens, rounds, alone_s,
                     decoder_s, per_layer_s)


def _mirrored(runs: dict[str, Callable[[], Any]], rounds: int, device: torch.device) -> dict[str, tuple[list, list]]:
    """{name: (seconds, outputs)} over `rounds` after one warm-up round, the order reversed every
    other round (bench.rounds.mirrored_rounds' rule: a library layer may not import the bench);
    on CUDA synchronised around each call."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    timed: dict[str, tuple[list, list]] = {name: ([], []) for name in runs}
    for round_ in range(-1, rounds):
        for name in (list(runs) if round_ % 2 == 0 else list(runs)[::-1]):
            sync()
            started = time.perf_counter()
            output = runs[name]()
            sync()
            if round_ >= 0:
                timed[name][0].append(time.perf_counter() - started)
                timed[name][1].append(output)
    return timed

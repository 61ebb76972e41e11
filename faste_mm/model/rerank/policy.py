"""Compressor policies for reranker pairs, asked by the runner before each layer like `FastE`:

- `ProtectedFastE`: Algorithm 1 with `protect="query"`: the first P_i positions (system turn,
  instruction and query: `Serialized.protected`) are never evicted, and the budget applies to the
  document part: with D_i = N_i - P_i document positions before the readout,
  R_i = P_i + max(1, round((1 - r_max) * D_i)) (capped at N_i); the trigger is FastE's own.
- `AttentionProbe`: never compresses; records the readout attention (FastE's ranking quantity)
  before one layer, for `Reranker.explain`.
"""

from __future__ import annotations

import torch

from faste_mm.model.decoder_state import DecoderState
from faste_mm.model.faste import Decision, FastE, FastEConfig, ThresholdTrigger, batch_alignment, prefix_budgets, readout_attention
from faste_mm.model.cpu.machine_plan import check_threads


def protected_budgets(n_prefix: torch.Tensor, protected: torch.Tensor, r_max: float) -> torch.Tensor:
    """R_i = P_i + max(1, round((1 - r_max) * (N_i - P_i))), never more than N_i; [B] int64."""
    protected = torch.minimum(protected, n_prefix)
    return torch.minimum(protected + prefix_budgets((n_prefix - protected).clamp(min=1), r_max), n_prefix)


class ProtectedFastE(FastE):
    """FastE whose keep plan always holds each row's protected span (the instruction + query):
    the same trigger and readout ranking, protected positions outranking every document one."""

    keeps_prefix = True  # the protected span survives: prefix reuse may go on after the trigger

    def __init__(self, config: FastEConfig, num_layers: int, protected: torch.Tensor) -> None:
        super().__init__(config, num_layers, scorer=self._protected_scores)
        self.protected = protected  # [B] on the batch's device

    def budgets(self, state: DecoderState) -> torch.Tensor:
        return protected_budgets(state.lengths - 1, self.protected, self.config.r_max)

    def _protected_scores(self, backbone, layer: int, state: DecoderState, budgets, config) -> torch.Tensor:
        scores = readout_attention(backbone, layer, state)  # [B, T], -inf outside the prefix
        positions = torch.arange(scores.shape[1], device=scores.device)[None, :]
        return scores.masked_fill((positions < self.protected[:, None]) & state.prefix_mask, float("inf"))


class AttentionProbe:
    """The full forward, recording the readout attention over the prefix [B, T] before the layer
    FastE would compress at (its alignment trigger), or before a fixed `layer`."""

    compresses = False

    def __init__(self, trigger: ThresholdTrigger, layer: int | None = None) -> None:
        self.trigger = trigger
        self.layer = layer
        self.recorded_layer: int | None = None
        self.weights: torch.Tensor | None = None  # [B, T] float32, sums to 1 over each row's prefix

    def before_layer(self, layer: int, state: DecoderState, backbone) -> Decision:
        if self.weights is not None:
            return Decision()
        if self.layer is not None:
            fire, alignment = layer == self.layer, None
        elif not self.trigger.is_monitored(layer):
            return Decision()
        else:
            with check_threads(state.hidden.device):
                alignment = float(batch_alignment(state))
            fire = self.trigger.fires(layer, alignment)
        if fire:
            weights = readout_attention(backbone, layer, state)
            self.weights = torch.where(state.prefix_mask, weights, 0.0)
            self.recorded_layer = layer
        return Decision(alignment=alignment)

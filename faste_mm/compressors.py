"""Compressor policies: asked by the runner before each decoder layer, they answer with a
`Decision` (nothing, or a `KeepPlan`). `Full` never compresses; `FastE` implements Algorithm 1:
after warm-up, the batch-mean readout/prefix alignment triggers one-shot compression at the
first layer reaching theta (fallback: before the last layer); a fixed `trigger_layer` and the
ranking ablations (FastV-style, random, block-last) are variants of the same policy.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Sequence

import torch

from faste_mm.backbones.defaults import BackboneDefaults
from faste_mm.decoder_state import DecoderState
from faste_mm.errors import ConfigError
from faste_mm.ranking import (
    RANKINGS,
    KeepPlan,
    block_last_scores,
    fastv_attention,
    plan_keep,
    prefix_budgets,
    random_scores,
    readout_attention,
)


@dataclass(frozen=True, slots=True)
class FastEConfig:
    """FastE settings (paper symbols in brackets).

    r_max: largest share of prefix states removed [r_max], 0 <= r_max < 1.
    warmup_layer: no alignment check before this layer [l_w]; None = backbone default (8).
    threshold: batch-mean readout/prefix cosine that triggers compression [theta];
        None = backbone default (0.70 Qwen3-VL-Embedding, 0.60 Qwen3-Embedding, 0.40 E5-Mistral).
    trigger_layer: compress right before this layer instead of using the alignment trigger
        (fixed-layer ablation; FastV uses 2).
    ranking: which states survive: "readout" (FastE), "fastv", "random", "block-last".
    seed: for ranking="random".
    fastv_queries: query positions averaged by ranking="fastv".
    """

    r_max: float = 0.5
    warmup_layer: int | None = None
    threshold: float | None = None
    trigger_layer: int | None = None
    ranking: str = "readout"
    seed: int = 0
    fastv_queries: int = 64

    def __post_init__(self) -> None:
        if not 0.0 <= self.r_max < 1.0:
            raise ConfigError(f"FastEConfig.r_max must be in [0, 1), got {self.r_max}")
        if self.warmup_layer is not None and self.warmup_layer < 0:
            raise ConfigError(f"FastEConfig.warmup_layer must be >= 0, got {self.warmup_layer}")
        if self.threshold is not None and not -1.0 <= self.threshold <= 1.0:
            raise ConfigError(f"FastEConfig.threshold is a cosine in [-1, 1], got {self.threshold}")
        if self.trigger_layer is not None and self.trigger_layer < 0:
            raise ConfigError(f"FastEConfig.trigger_layer must be >= 0, got {self.trigger_layer}")
        if self.ranking not in RANKINGS:
            raise ConfigError(f"FastEConfig.ranking must be one of {', '.join(RANKINGS)}; got {self.ranking!r}")
        if self.fastv_queries < 1:
            raise ConfigError(f"FastEConfig.fastv_queries must be >= 1, got {self.fastv_queries}")

    @classmethod
    def fastv(cls, r_max: float) -> "FastEConfig":
        """FastV baseline: rank by attention averaged over query positions, after layer 2."""
        return cls(r_max=r_max, trigger_layer=2, ranking="fastv")

    def resolved(self, defaults: BackboneDefaults, num_layers: int) -> "FastEConfig":
        """Fill backbone defaults and check layer indices against the model depth."""
        if self.trigger_layer is not None and self.trigger_layer >= num_layers:
            raise ConfigError(
                f"FastEConfig.trigger_layer must be < {num_layers} (layers of this model), got {self.trigger_layer}"
            )
        return replace(
            self,
            warmup_layer=defaults.warmup_layer if self.warmup_layer is None else self.warmup_layer,
            threshold=defaults.threshold if self.threshold is None else self.threshold,
        )

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Decision:
    """A policy's answer before one layer: a plan to apply now (or None), and the batch-mean
    alignment it measured there (None when it did not measure)."""

    plan: KeepPlan | None = None
    alignment: float | None = None


class Full:
    """No compression: the reference forward."""

    def before_layer(self, layer: int, state: DecoderState, backbone) -> Decision:
        return Decision()


class AlignmentProbe:
    """The full forward that also measures the batch-mean alignment before every layer
    (for calibration: one pass gives the whole alignment curve)."""

    def before_layer(self, layer: int, state: DecoderState, backbone) -> Decision:
        return Decision(alignment=float(batch_alignment(state)))


def batch_alignment(state: DecoderState) -> torch.Tensor:
    """Mean over the batch of g_i = cos(h_readout, mean of valid prefix states) (paper Eq. 2)."""
    hidden = state.hidden  # [B, T, H], the model's dtype
    prefix = state.prefix_mask  # [B, T]
    n_prefix = prefix.sum(dim=1, keepdim=True).clamp(min=1)  # [B, 1]
    # one [B, 1, T] x [B, T, H] product (fp32 accumulation) instead of a float copy and a masked
    # copy of the whole hidden state at every monitored layer
    prefix_sum = torch.bmm(prefix[:, None, :].to(hidden.dtype), hidden)[:, 0].float()  # [B, H]
    readout = state.readout_hidden().float()  # [B, H]
    return torch.nn.functional.cosine_similarity(readout, prefix_sum / n_prefix, dim=-1).mean()


def first_checked_layer(warmup_layer: int, num_layers: int) -> int:
    """The first layer whose alignment FastE checks: l_w, or the last layer when l_w is past the
    depth (the fallback still compresses there)."""
    return min(warmup_layer, num_layers - 1)


@dataclass(frozen=True, slots=True)
class ThresholdTrigger:
    """When FastE compresses (paper Eq. threshold-trigger, Algorithm 1): before each layer l from
    the warm-up layer l_w on, it fires if the batch-mean alignment g reaches theta; the last layer
    L-1 always fires (fallback). The one statement of the rule: `FastE` applies it online, layer
    by layer, and calibration replays it over recorded alignment curves (`first_layer`).
    """

    threshold: float  # theta
    warmup_layer: int  # l_w; past the depth, only the last layer is checked
    num_layers: int  # L

    def is_monitored(self, layer: int) -> bool:
        """Whether the alignment is checked before `layer`."""
        return layer >= first_checked_layer(self.warmup_layer, self.num_layers)

    def fires(self, layer: int, alignment: float) -> bool:
        """For a monitored layer: compress now?"""
        return alignment >= self.threshold or layer == self.num_layers - 1

    def first_layer(self, alignments: Sequence[float]) -> int:
        """The layer FastE compresses before, given alignments[l] measured before each layer l
        of the full forward (identical to FastE's up to its trigger: nothing is compressed earlier)."""
        if len(alignments) != self.num_layers:
            raise ConfigError(f"ThresholdTrigger: {len(alignments)} alignments for a {self.num_layers}-layer model")
        for layer in range(self.num_layers):
            if self.is_monitored(layer) and self.fires(layer, float(alignments[layer])):
                return layer
        raise AssertionError("unreachable: the last layer always fires")


class FastE:
    """Algorithm 1 (and its ablations) for one model; construct with a resolved config."""

    def __init__(self, config: FastEConfig, num_layers: int) -> None:
        if config.warmup_layer is None or config.threshold is None:
            raise ConfigError("FastE needs a resolved FastEConfig (use FastEConfig.resolved)")
        self.config = config
        self.num_layers = num_layers
        self.trigger = ThresholdTrigger(config.threshold, config.warmup_layer, num_layers)

    def before_layer(self, layer: int, state: DecoderState, backbone) -> Decision:
        config = self.config
        alignment = None
        if config.trigger_layer is not None:
            fire = layer == config.trigger_layer
        else:
            if not self.trigger.is_monitored(layer):
                return Decision()
            alignment = float(batch_alignment(state))  # the one host sync per monitored layer
            fire = self.trigger.fires(layer, alignment)
        if not fire:
            return Decision(alignment=alignment)
        budgets = prefix_budgets(state.lengths - 1, config.r_max)  # [B] R_i
        return Decision(plan=plan_keep(self._scores(layer, state, backbone, budgets), budgets, state), alignment=alignment)

    def _scores(self, layer: int, state: DecoderState, backbone, budgets: torch.Tensor) -> torch.Tensor:
        ranking = self.config.ranking
        if ranking == "readout":
            return readout_attention(backbone, layer, state)
        if ranking == "fastv":
            return fastv_attention(backbone, layer, state, self.config.fastv_queries)
        if ranking == "random":
            return random_scores(state, self.config.seed + layer)
        return block_last_scores(state, budgets)

"""FastE, Algorithm 1 of docs/design.md ("FastE, the method"), top to bottom in its order and symbols.

The runner (`runner.run_decoder`) owns the layer loop and asks the policy before each layer l;
everything the policy decides is here. Algorithm 1, line by line:

  input l_w, theta, r_max                      `FastEConfig` (defaults per backbone: backbones/registry)
  1     R_i = min(N_i, max(1, round((1 - r_max) N_i)))   `prefix_budgets`
  2     compressed = false                     the runner: no question is asked after a keep plan
  3-4   for l ...: if not compressed and l >= l_w   `ThresholdTrigger.is_monitored`
  5     g_i^l = cos(h_readout, mean prefix)    `batch_alignment` ...
  6     g^l = mean over the batch              ... averaged over the batch there (`FastE.measure`)
  7     if g^l >= theta or l = L-1             `ThresholdTrigger.fires` (the fallback is l = L-1),
                                               asked in `FastE.decide` once the value reaches the host
  8     w_i^l: attention from the readout      `readout_attention` (GQA, QK-norm, RoPE at the
                                               original positions, softmax over the prefix only)
  9     S_i = sort(TopK(w_i^l, R_i))           `plan_keep` -> `KeepPlan`
  10    [h_j for j in S_i] + readout,          the runner applies the plan with one gather that
        original rotary positions kept         also carries (cos, sin) and the masks
  11    compressed = true                      the runner (one shot)
  12    run F_l on every row's states          the runner's layer call
  13    z_i = Norm(h_readout^L)                `pooling.pool_readout`

`FastE` is the policy that strings these together. Its ranking is pluggable only so the controls
of docs/design.md (FastV-style, random, block-last: `ablations.py`) run through the same trigger
and budgets. Lines 5-6 and 7 are two calls (`measure`, `decide`) so that on a GPU the runner can
queue layer l before the host waits for g (`AlignmentReading`): the same decisions without a
stalled device.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Callable, Sequence

import torch

from faste_mm.errors import ConfigError
from faste_mm.model.backbones.registry import Family
from faste_mm.model.decoder_state import DecoderState

# FastE's own ranking and the ablations' names (their scorers live in ablations.SCORERS).
RANKINGS = ("readout", "fastv", "random", "block-last")

# (backbone, layer, state, budgets [B], config) -> [B, T] float32 scores, -inf outside the prefix
Scorer = Callable[..., torch.Tensor]


@dataclass(frozen=True, slots=True)
class FastEConfig:
    """FastE settings (the symbols of docs/design.md, Algorithm 1, in brackets).

    r_max: largest share of prefix states removed [r_max], 0 <= r_max < 1.
    warmup_layer: no alignment check before this layer [l_w]; None = backbone default (8).
    threshold: batch-mean readout/prefix cosine that triggers compression [theta];
        None = backbone default (0.70 Qwen3-VL-Embedding, 0.60 Qwen3-Embedding, 0.40 E5-Mistral).
    trigger_layer: compress right before this layer instead of using the alignment trigger
        (fixed-layer ablation; FastV uses 2).
    ranking: which states survive: "readout" (FastE) or an ablation of `ablations.SCORERS`
        ("fastv", "random", "block-last").
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

    def resolved(self, defaults: Family, num_layers: int) -> "FastEConfig":
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


# Algorithm 1, line 1: per-sample budgets.
def prefix_budgets(n_prefix: torch.Tensor, r_max: float) -> torch.Tensor:
    """R_i = max(1, round((1 - r_max) * N_i)), never more than N_i.

    torch.round rounds half to even like Python's round; float64 keeps (1 - r_max) * N_i
    bit-identical to the Python expression.
    """
    keep = torch.round((1.0 - r_max) * n_prefix.double()).long()
    return torch.minimum(keep.clamp(min=1), n_prefix)


# Lines 3-7: when to compress.
def batch_alignment(state: DecoderState) -> torch.Tensor:
    """Mean over the batch of g_i = cos(h_readout, mean of valid prefix states) (lines 5-6),
    accumulated in float32 whatever the model's dtype, so the trigger never flips on rounding.
    (The runner runs it on the check's threads: `machine_plan.check_threads`.)"""
    hidden = state.hidden  # [B, T, H], the model's dtype
    prefix = state.prefix_mask  # [B, T]
    n_prefix = prefix.sum(dim=1, keepdim=True).clamp(min=1)  # [B, 1]
    if hidden.dtype == torch.float32:
        # one [B, 1, T] x [B, T, H] product instead of a masked copy of the whole hidden state
        prefix_sum = torch.bmm(prefix[:, None, :].to(hidden.dtype), hidden)[:, 0]  # [B, H]
    elif hidden.device.type == "cpu":
        # Row b's prefix is its first N_b slots (right padding, `prefix_mask`): each summed in
        # place with float32 accumulation, with no masked [B, T, H] copy (on one thread, B small
        # reductions cost less than the copy). Exact: padding never enters the sum.
        counts = (state.lengths - 1).tolist()
        prefix_sum = torch.stack([hidden[row, :count].sum(dim=0, dtype=torch.float32)
                                  for row, count in enumerate(counts)])  # [B, H]
    else:
        # a 16-bit product would round the sum to 8 mantissa bits (no bmm with a float32 output
        # here): a masked 16-bit view summed with float32 accumulation, never a float32 copy
        prefix_sum = torch.where(prefix[..., None], hidden, 0).sum(dim=1, dtype=torch.float32)  # [B, H]
    readout = state.readout_hidden().float()  # [B, H]
    return torch.nn.functional.cosine_similarity(readout, prefix_sum / n_prefix, dim=-1).mean()


@dataclass(frozen=True, slots=True)
class AlignmentReading:
    """Lines 5-6's g before one layer, on its way to the host. On CUDA the value is copied
    without blocking into page-locked memory behind an event, so the device work queued after the
    check (the runner queues the layer itself) goes on while the host waits for this value alone;
    elsewhere it is the value itself."""

    alignment: torch.Tensor  # [] float32; on CUDA a pinned host copy, valid once `ready` has passed
    ready: "torch.cuda.Event | None" = None

    @classmethod
    def of(cls, alignment: torch.Tensor) -> "AlignmentReading":
        if alignment.device.type != "cuda":
            return cls(alignment)
        host = torch.empty((), dtype=alignment.dtype, pin_memory=True)
        host.copy_(alignment, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return cls(host, ready)

    def value(self) -> float:
        """The host read FastE decides by (on CUDA: waits for this check, not for what follows it)."""
        if self.ready is not None:
            self.ready.synchronize()
        return float(self.alignment)


def first_checked_layer(warmup_layer: int, num_layers: int) -> int:
    """The first layer whose alignment FastE checks: l_w, or the last layer when l_w is past the
    depth (the fallback still compresses there)."""
    return min(warmup_layer, num_layers - 1)


@dataclass(frozen=True, slots=True)
class ThresholdTrigger:
    """When FastE compresses (the trigger rule, Algorithm 1 lines 4-7): before each layer l from
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


# Line 8: which prefix states matter to the readout.
def masked_scores(scores: torch.Tensor, state: DecoderState) -> torch.Tensor:
    return scores.float().masked_fill(~state.prefix_mask, float("-inf"))


def readout_attention(backbone, layer: int, state: DecoderState) -> torch.Tensor:
    """FastE ranking (the keep rule, line 8): attention each prefix state receives from the
    readout, softmax over the active prefix keys per query head, averaged over heads. The rotated
    q/k (from the adapter), logits, softmax and head mean are float32 whatever the model's dtype."""
    rows = torch.arange(state.hidden.shape[0], device=state.hidden.device)
    readout = state.readout_index
    q = backbone.project_queries(
        layer, state.hidden[rows, readout][:, None], state.cos[rows, readout][:, None], state.sin[rows, readout][:, None]
    )  # [B, A, 1, D_h]
    k = backbone.project_keys(layer, state.hidden, state.cos, state.sin)  # [B, A_kv, T, D_h]
    batch, heads, _, head_dim = q.shape
    kv_heads = k.shape[1]
    q = q.view(batch, kv_heads, heads // kv_heads, head_dim)
    logits = torch.einsum("bkgd,bktd->bkgt", q, k) * backbone.attention_scale(layer)
    logits = logits.reshape(batch, heads, -1)  # [B, A, T]
    # The readout is excluded from the competition, so the softmax runs over prefix keys only.
    probs = logits.masked_fill(~state.prefix_mask[:, None, :], float("-inf")).softmax(dim=-1)
    return masked_scores(probs.mean(dim=1), state)


# Line 9: the keep plan the runner applies (line 10).
@dataclass(frozen=True, slots=True)
class KeepPlan:
    """Slots to keep per row: R_i prefix positions in original order, then the readout."""

    index: torch.Tensor  # [B, R_max + 1]; columns >= lengths[b] are padding
    lengths: torch.Tensor  # [B] = R_i + 1


def plan_keep(scores: torch.Tensor, budgets: torch.Tensor, state: DecoderState) -> KeepPlan:
    """Top-R_i prefix slots by score, re-sorted into causal order, readout appended last."""
    batch, width = scores.shape
    r_max = int(budgets.max())
    top = scores.topk(r_max, dim=1).indices  # [B, R_max], best first
    column = torch.arange(r_max + 1, device=scores.device)[None, :]  # [1, R_max + 1]
    sentinel = width  # sorts after every real slot
    top = torch.where(column[:, :r_max] < budgets[:, None], top, sentinel)
    kept = torch.cat([top, torch.full((batch, 1), sentinel, device=top.device, dtype=top.dtype)], dim=1)
    kept = kept.sort(dim=1).values  # [B, R_max + 1]: R_i slots ascending, then sentinels
    readout = state.readout_index[:, None].expand(-1, r_max + 1)
    kept = torch.where(column == budgets[:, None], readout, kept)
    kept = torch.where(kept == sentinel, 0, kept)  # padding columns point anywhere; masked later
    return KeepPlan(index=kept, lengths=budgets + 1)


# The policy the runner asks before each layer.
@dataclass(frozen=True, slots=True)
class Decision:
    """A policy's answer before one layer: a plan to apply now (or None), and the batch-mean
    alignment it measured there (None when it did not measure)."""

    plan: KeepPlan | None = None
    alignment: float | None = None


def readout_scores(backbone, layer: int, state: DecoderState, budgets: torch.Tensor, config: FastEConfig) -> torch.Tensor:
    """FastE's scorer (the `Scorer` signature over `readout_attention`)."""
    return readout_attention(backbone, layer, state)


class FastE:
    """Algorithm 1 for one model; construct with a resolved config.

    `scorer` ranks the prefix at the trigger (default: the readout's attention, FastE itself);
    the ablations pass theirs from `ablations.SCORERS`.
    """

    compresses = True  # the runner's unpadded-kernel trial only matters for policies that compress
    keeps_prefix = False  # a trigger may evict any prefix position (rerank.policy.ProtectedFastE keeps the query)

    def __init__(self, config: FastEConfig, num_layers: int, scorer: Scorer = readout_scores) -> None:
        if config.warmup_layer is None or config.threshold is None:
            raise ConfigError("FastE needs a resolved FastEConfig (use FastEConfig.resolved)")
        self.config = config
        self.num_layers = num_layers
        self.trigger = ThresholdTrigger(config.threshold, config.warmup_layer, num_layers)
        self.scorer = scorer

    def before_layer(self, layer: int, state: DecoderState, backbone) -> Decision:
        """Lines 4-11 before `layer`: measure, then decide."""
        return self.decide(layer, state, backbone, self.measure(layer, state))

    def measure(self, layer: int, state: DecoderState) -> AlignmentReading | None:
        """Lines 4-6: g before a monitored layer, queued on the model's device; None where
        nothing is checked (before l_w; the fixed-layer ablation never checks)."""
        if self.config.trigger_layer is not None or not self.trigger.is_monitored(layer):
            return None
        return AlignmentReading.of(batch_alignment(state))

    def decide(self, layer: int, state: DecoderState, backbone, reading: AlignmentReading | None) -> Decision:
        """Lines 7-11: compress before `layer`? `reading` is `measure`'s for this layer and state."""
        config = self.config
        alignment = None
        if config.trigger_layer is not None:  # fixed-layer ablation: no alignment check
            fire = layer == config.trigger_layer
        elif reading is None:
            return Decision()
        else:
            alignment = reading.value()  # the one host read per monitored layer
            fire = self.trigger.fires(layer, alignment)
        if not fire:
            return Decision(alignment=alignment)
        budgets = self.budgets(state)  # [B] R_i
        scores = self.scorer(backbone, layer, state, budgets, config)  # [B, T]
        return Decision(plan=plan_keep(scores, budgets, state), alignment=alignment)

    def budgets(self, state: DecoderState) -> torch.Tensor:
        """Line 1 for the rows of `state`: R_i from N_i = lengths - 1."""
        return prefix_budgets(state.lengths - 1, self.config.r_max)

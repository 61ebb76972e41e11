"""The controls of docs/design.md ("FastE, the method") and the policies that never compress,
beside FastE (`faste.py`).

`Full` is the reference forward, `AlignmentProbe` the full forward that records the alignment
curve (calibration). The scorers rank prefix states in place of the readout's attention, through
FastE's own trigger and budgets: FastV-style mean attention, random, and block-last (position
only). `SCORERS` maps `FastEConfig.ranking` to its scorer.

Scores are [B, T] float32 with -inf outside each row's prefix. No N x N matrix is ever built.
"""

from __future__ import annotations

import torch

from faste_mm.model.decoder_state import DecoderState
from faste_mm.model.faste import (RANKINGS, AlignmentReading, Decision, FastE, FastEConfig, Scorer, batch_alignment,
                                  masked_scores, readout_scores)


class Full:
    """No compression: the reference forward."""

    compresses = False

    def before_layer(self, layer: int, state: DecoderState, backbone) -> Decision:
        return Decision()


class AlignmentProbe:
    """The full forward that also measures the batch-mean alignment before every layer
    (for calibration: one pass gives the whole alignment curve). Like `FastE` it measures and
    decides in two steps, so the runner reads each value after queuing the layer (on CUDA)."""

    compresses = False

    def before_layer(self, layer: int, state: DecoderState, backbone) -> Decision:
        return self.decide(layer, state, backbone, self.measure(layer, state))

    def measure(self, layer: int, state: DecoderState) -> AlignmentReading:
        return AlignmentReading.of(batch_alignment(state))

    def decide(self, layer: int, state: DecoderState, backbone, reading: AlignmentReading) -> Decision:
        return Decision(alignment=reading.value())


def _attention_rows(backbone, layer: int, state: DecoderState, query_positions: torch.Tensor) -> torch.Tensor:
    """Softmax attention of the given query rows over their causal, valid keys, per query head.

    query_positions [B, S] -> [B, A, S, T] float32 (GQA: query head h reads KV head h // (A / A_kv)).
    """
    rows = torch.arange(state.hidden.shape[0], device=state.hidden.device)[:, None]
    q = backbone.project_queries(
        layer, state.hidden[rows, query_positions], state.cos[rows, query_positions], state.sin[rows, query_positions]
    )  # [B, A, S, D_h]
    k = backbone.project_keys(layer, state.hidden, state.cos, state.sin)  # [B, A_kv, T, D_h]
    batch, heads, n_queries, head_dim = q.shape
    kv_heads = k.shape[1]
    q = q.view(batch, kv_heads, heads // kv_heads, n_queries, head_dim)  # query head = kv * G + g
    logits = torch.einsum("bkgsd,bktd->bkgst", q.float(), k.float()) * backbone.attention_scale(layer)
    logits = logits.reshape(batch, heads, n_queries, -1)  # [B, A, S, T]
    keys = torch.arange(k.shape[2], device=k.device)
    allowed = (keys[None, None, :] <= query_positions[:, :, None]) & state.valid[:, None, :]  # [B, S, T]
    return logits.masked_fill(~allowed[:, None], float("-inf")).softmax(dim=-1)


def fastv_attention(backbone, layer: int, state: DecoderState, n_queries: int) -> torch.Tensor:
    """FastV-style ranking: attention received, averaged over heads and up to `n_queries`
    query positions spread evenly over each row (all positions when the row is shorter)."""
    width = state.hidden.shape[1]
    samples = min(n_queries, width)
    j = torch.arange(samples, device=state.hidden.device)[None, :]  # [1, S]
    lengths = state.lengths[:, None]
    positions = torch.where(lengths >= samples, j * lengths // samples, j)  # [B, S]
    is_query = positions < lengths  # [B, S]
    positions = torch.where(is_query, positions, 0)
    probs = _attention_rows(backbone, layer, state, positions).mean(dim=1)  # [B, S, T]
    probs = probs * is_query[..., None]
    scores = probs.sum(dim=1) / is_query.sum(dim=1, keepdim=True)
    return masked_scores(scores, state)


def random_scores(state: DecoderState, seed: int) -> torch.Tensor:
    """Uniform random ranking, reproducible for a given seed."""
    generator = torch.Generator().manual_seed(seed)
    scores = torch.rand(state.hidden.shape[:2], generator=generator).to(state.hidden.device)
    return masked_scores(scores, state)


def block_last_scores(state: DecoderState, budgets: torch.Tensor) -> torch.Tensor:
    """Position-only control (docs/design.md, "Controls beside FastE"): split the prefix into R_i contiguous,
    nearly equal blocks and keep the causally last state of each."""
    n_prefix = state.lengths - 1
    blocks = torch.arange(int(budgets.max()), device=budgets.device)[None, :]  # [1, R_max]
    ends = (blocks + 1) * n_prefix[:, None] // budgets[:, None] - 1  # [B, R_max]
    in_budget = blocks < budgets[:, None]
    scores = torch.zeros(state.hidden.shape[:2], device=budgets.device)
    scores.scatter_add_(1, torch.where(in_budget, ends, 0), in_budget.float())  # add: no write races
    return masked_scores(scores, state)


def _fastv(backbone, layer: int, state: DecoderState, budgets: torch.Tensor, config: FastEConfig) -> torch.Tensor:
    return fastv_attention(backbone, layer, state, config.fastv_queries)


def _random(backbone, layer: int, state: DecoderState, budgets: torch.Tensor, config: FastEConfig) -> torch.Tensor:
    return random_scores(state, config.seed + layer)


def _block_last(backbone, layer: int, state: DecoderState, budgets: torch.Tensor, config: FastEConfig) -> torch.Tensor:
    return block_last_scores(state, budgets)


SCORERS: dict[str, Scorer] = {"readout": readout_scores, "fastv": _fastv, "random": _random, "block-last": _block_last}
assert tuple(SCORERS) == RANKINGS


def policy_for(config: FastEConfig | None, num_layers: int, record_alignment: bool = False):
    """The policy for a resolved config: FastE with its ranking's scorer; None -> the full
    forward (recording the alignment curve when asked)."""
    if config is None:
        return AlignmentProbe() if record_alignment else Full()
    return FastE(config, num_layers, SCORERS[config.ranking])

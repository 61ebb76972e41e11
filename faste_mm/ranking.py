"""Which prefix states survive: per-sample budgets (paper Eq. final-budget), prefix scores from
the readout's attention (FastE) or from the ablation rules (FastV-style, random, block-last),
and the keep plan (Top-R_i in causal order, readout last) that the runner applies in one gather.

Scores are [B, T] float32 with -inf outside each row's prefix. No N x N matrix is ever built.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from faste_mm.decoder_state import DecoderState

RANKINGS = ("readout", "fastv", "random", "block-last")


@dataclass(frozen=True, slots=True)
class KeepPlan:
    """Slots to keep per row: R_i prefix positions in original order, then the readout."""

    index: torch.Tensor  # [B, R_max + 1]; columns >= lengths[b] are padding
    lengths: torch.Tensor  # [B] = R_i + 1


def prefix_budgets(n_prefix: torch.Tensor, r_max: float) -> torch.Tensor:
    """R_i = max(1, round((1 - r_max) * N_i)), never more than N_i.

    torch.round rounds half to even like Python's round; float64 keeps (1 - r_max) * N_i
    bit-identical to the Python expression.
    """
    keep = torch.round((1.0 - r_max) * n_prefix.double()).long()
    return torch.minimum(keep.clamp(min=1), n_prefix)


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


def _masked(scores: torch.Tensor, state: DecoderState) -> torch.Tensor:
    return scores.float().masked_fill(~state.prefix_mask, float("-inf"))


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


def readout_attention(backbone, layer: int, state: DecoderState) -> torch.Tensor:
    """FastE ranking (paper Eq. readout-importance): attention each prefix state receives from the
    readout, softmax over the active prefix keys per query head, averaged over heads."""
    rows = torch.arange(state.hidden.shape[0], device=state.hidden.device)
    readout = state.readout_index
    q = backbone.project_queries(
        layer, state.hidden[rows, readout][:, None], state.cos[rows, readout][:, None], state.sin[rows, readout][:, None]
    )  # [B, A, 1, D_h]
    k = backbone.project_keys(layer, state.hidden, state.cos, state.sin)  # [B, A_kv, T, D_h]
    batch, heads, _, head_dim = q.shape
    kv_heads = k.shape[1]
    q = q.view(batch, kv_heads, heads // kv_heads, head_dim)
    logits = torch.einsum("bkgd,bktd->bkgt", q.float(), k.float()) * backbone.attention_scale(layer)
    logits = logits.reshape(batch, heads, -1)  # [B, A, T]
    # The readout is excluded from the competition, so the softmax runs over prefix keys only.
    probs = logits.masked_fill(~state.prefix_mask[:, None, :], float("-inf")).softmax(dim=-1)
    return _masked(probs.mean(dim=1), state)


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
    return _masked(scores, state)


def random_scores(state: DecoderState, seed: int) -> torch.Tensor:
    """Uniform random ranking, reproducible for a given seed."""
    generator = torch.Generator().manual_seed(seed)
    scores = torch.rand(state.hidden.shape[:2], generator=generator).to(state.hidden.device)
    return _masked(scores, state)


def block_last_scores(state: DecoderState, budgets: torch.Tensor) -> torch.Tensor:
    """Position-only control (paper, depth-wise diagnostic): split the prefix into R_i contiguous,
    nearly equal blocks and keep the causally last state of each."""
    n_prefix = state.lengths - 1
    blocks = torch.arange(int(budgets.max()), device=budgets.device)[None, :]  # [1, R_max]
    ends = (blocks + 1) * n_prefix[:, None] // budgets[:, None] - 1  # [B, R_max]
    in_budget = blocks < budgets[:, None]
    scores = torch.zeros(state.hidden.shape[:2], device=budgets.device)
    scores.scatter_add_(1, torch.where(in_budget, ends, 0), in_budget.float())  # add: no write races
    return _masked(scores, state)

"""Decoder-backbone FLOPs from realised padded shapes (the formulas of docs/design.md, "FastE,
the method": FLOPs). The runner records each batch's padded length per layer; this module turns
those shapes into FLOPs for the realised run and for the same batches without compression.

FastE leaves the vision tower alone, so on images and pages the decoder's FLOPs-implied speedup
overstates what the whole forward can gain; `vision_flops` counts the tower (Qwen3-VL's ViT and
patch mergers) so a whole-forward figure can be given next to the decoder's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True, slots=True)
class DecoderShape:
    """Dimensions of the decoder stack. Letters follow docs/design.md: H, I, A, A_kv, d_h, L."""

    num_layers: int  # L
    hidden: int  # H
    intermediate: int  # I (SwiGLU)
    heads: int  # A
    kv_heads: int  # A_kv
    head_dim: int  # d_h

    def to_dict(self) -> dict:
        return asdict(self)


def layer_flops(shape: DecoderShape, tokens: int, pairs: int) -> int:
    """C_l(T, P) = 2T[H(Q+2K) + QH] + 4 P A d_h + 6 T H I, with Q = A d_h and K = A_kv d_h.

    tokens = T (sum of padded tokens), pairs = P (sum of padded length squared).
    """
    q = shape.heads * shape.head_dim
    k = shape.kv_heads * shape.head_dim
    projections = 2 * tokens * (shape.hidden * (q + 2 * k) + q * shape.hidden)
    attention = 4 * pairs * shape.heads * shape.head_dim
    mlp = 6 * tokens * shape.hidden * shape.intermediate
    return projections + attention + mlp


def batch_flops(shape: DecoderShape, batch_size: int, padded_lengths: list[int]) -> int:
    """FLOPs of one batch whose layer l ran on `padded_lengths[l]` padded tokens per row."""
    return sum(layer_flops(shape, batch_size * n, batch_size * n * n) for n in padded_lengths)


def full_batch_flops(shape: DecoderShape, batch_size: int, padded_length: int) -> int:
    """FLOPs of the same batch with no compression: every layer at the input length."""
    return batch_flops(shape, batch_size, [padded_length] * shape.num_layers)


@dataclass(frozen=True, slots=True)
class VisionShape:
    """Dimensions of a Qwen3-VL vision tower: ViT blocks, then patch mergers."""

    depth: int
    hidden: int  # d
    intermediate: int  # I of the non-gated GELU MLP
    patch_dim: int  # in_channels x temporal_patch_size x patch_size^2: the patch embedding's input
    merge: int  # patches per merged token (spatial_merge_size^2)
    out_hidden: int  # the merged tokens' width (the decoder's H)
    mergers: int  # the final merger plus one per DeepStack level

    def to_dict(self) -> dict:
        return asdict(self)


def vision_flops(shape: VisionShape, grids: list[tuple[int, int, int]]) -> int:
    """FLOPs of the tower on images of (t, h, w) patch grids, N = t h w patches each.

    Patch embedding 2 N P d; per block 2N(3d^2 + d^2) for qkv and proj, 4 f^2 d per frame of
    f = h w patches (attention is full within a frame, never across images), 4 N d I for the MLP;
    per merger 2 (N / m)(m d . m d + m d . H_out) on the merged tokens.
    """
    d, m = shape.hidden, shape.merge
    total = 0
    for t, h, w in grids:
        n = t * h * w
        block = 8 * n * d * d + t * 4 * (h * w) ** 2 * d + 4 * n * d * shape.intermediate
        merger = 2 * (n // m) * (m * d * m * d + m * d * shape.out_hidden)
        total += 2 * n * shape.patch_dim * d + shape.depth * block + shape.mergers * merger
    return total


def removed_share(kept: int, total: int) -> float:
    """1 - kept/total (0 when there was nothing): FLOPs reduction, prefix removal."""
    return 0.0 if total == 0 else 1.0 - kept / total


def tower_share(tower: float, decoder: float) -> float:
    """The vision tower's share of tower + decoder (seconds or FLOPs; 0 when nothing ran)."""
    total = tower + decoder
    return tower / total if total else 0.0


def flops_reduction(realised: int, full: int) -> float:
    """1 - FastE/Full over the same batches (0 when nothing ran)."""
    return removed_share(realised, full)

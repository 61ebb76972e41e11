"""Decoder-backbone FLOPs from realised padded shapes (paper appendix, "Decoder-Backbone FLOPs
Accounting"). The runner records each batch's padded length per layer; this module turns
those shapes into FLOPs for the realised run and for the same batches without compression.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True, slots=True)
class DecoderShape:
    """Dimensions of the decoder stack. Letters follow the appendix: H, I, A, A_kv, d_h, L."""

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


def flops_reduction(realised: int, full: int) -> float:
    """1 - FastE/Full over the same batches (0 when nothing ran)."""
    return 0.0 if full == 0 else 1.0 - realised / full

"""Pooling: the sequence embedding is the FINAL-NORMED hidden state of the readout (last valid)
token, L2-normalised; Matryoshka truncation keeps the first d dims and re-normalises.
"""

from __future__ import annotations

import torch

from faste_mm.errors import ConfigError


def pool_readout(backbone, hidden_readout: torch.Tensor) -> torch.Tensor:
    """[B, H] pre-norm readout states -> [B, H] float32 unit vectors.

    The final RMSNorm is per token, so norming only the readout rows equals pooling
    `last_hidden_state` (pooling the pre-norm state is a known bug that costs MMEB points).
    The readout rows are upcast before the norm, so a 16-bit model's vectors are normed and
    normalised in float32 (HF's RMSNorm would round its output back to the model's dtype).
    """
    return l2_normalize(backbone.final_norm(hidden_readout.float()))


def l2_normalize(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.normalize(x, p=2, dim=-1)


def truncate_dim(embeddings: torch.Tensor, dim: int | None) -> torch.Tensor:
    """Matryoshka: first `dim` dimensions, re-normalised; None keeps them all."""
    if dim is None or dim == embeddings.shape[-1]:
        return embeddings
    if not 1 <= dim <= embeddings.shape[-1]:
        raise ConfigError(f"dim must be in [1, {embeddings.shape[-1]}] for this model, got {dim}")
    return l2_normalize(embeddings[..., :dim])

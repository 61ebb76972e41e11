"""Backbone adapter interface: the only code that knows a model family. The runner drives the
decoder through it (embed, per-layer masks, layers, final norm) and compressor policies use it
for readout scoring (each layer's own input norm, q/k projections, QK-norm and RoPE).
"""

from __future__ import annotations

import torch
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

from faste_mm.batching import Batch
from faste_mm.decoder_state import DecoderState
from faste_mm.flops import DecoderShape


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Backbone:
    """Shared mechanics of HF decoder stacks (`layers`, `norm`, `rotary_emb`, `embed_tokens`).

    Subclasses implement `embed` (and, for DeepStack, `after_layer`).
    """

    family: str = ""

    def __init__(self, model: torch.nn.Module, decoder: torch.nn.Module, text_config) -> None:
        self.model = model
        self.decoder = decoder  # the module holding embed_tokens / layers / norm / rotary_emb
        self.text_config = text_config
        self.layers = list(decoder.layers)
        self.shape = DecoderShape(
            num_layers=len(self.layers),
            hidden=text_config.hidden_size,
            intermediate=text_config.intermediate_size,
            heads=text_config.num_attention_heads,
            kv_heads=text_config.num_key_value_heads,
            head_dim=getattr(text_config, "head_dim", None)
            or text_config.hidden_size // text_config.num_attention_heads,
        )
        self._mask_kinds = _layer_mask_kinds(text_config, len(self.layers))

    @property
    def device(self) -> torch.device:
        return self.decoder.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.decoder.embed_tokens.weight.dtype

    @property
    def embedding_dim(self) -> int:
        return self.shape.hidden

    def embed(self, batch: Batch) -> DecoderState:
        raise NotImplementedError

    def attention_masks(self, state: DecoderState) -> dict[str, torch.Tensor | None]:
        """The 4-D masks HF's own forward would build for this padding, one per attention kind."""
        kwargs = dict(
            config=self.text_config,
            inputs_embeds=state.hidden,
            attention_mask=state.valid,
            past_key_values=None,
            position_ids=None,  # gapped ids after compression would read as packed sequences
        )
        masks: dict[str, torch.Tensor | None] = {}
        for kind in set(self._mask_kinds):
            build = create_sliding_window_causal_mask if kind == "sliding_attention" else create_causal_mask
            masks[kind] = build(**kwargs)
        return masks

    def run_layer(self, index: int, state: DecoderState, masks: dict) -> torch.Tensor:
        return self.layers[index](
            state.hidden,
            attention_mask=masks[self._mask_kinds[index]],
            position_embeddings=(state.cos, state.sin),
            position_ids=None,
        )

    def after_layer(self, index: int, state: DecoderState) -> DecoderState:
        """Hook for per-layer injections (DeepStack); plain decoders have none."""
        return state

    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.decoder.norm(hidden)

    # -- readout scoring: layer `index`'s own projections, norms and RoPE at original positions --

    def project_queries(self, index: int, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """[B, S, H] hidden rows -> [B, A, S, D_h] rotated queries of layer `index`."""
        return self._project(index, hidden, cos, sin, "q_proj", "q_norm")

    def project_keys(self, index: int, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """[B, T, H] hidden -> [B, A_kv, T, D_h] rotated keys of layer `index`."""
        return self._project(index, hidden, cos, sin, "k_proj", "k_norm")

    def attention_scale(self, index: int) -> float:
        return float(self.layers[index].self_attn.scaling)

    def _project(self, index, hidden, cos, sin, proj_name: str, norm_name: str) -> torch.Tensor:
        layer = self.layers[index]
        attention = layer.self_attn
        batch, rows, _ = hidden.shape
        x = getattr(attention, proj_name)(layer.input_layernorm(hidden))
        x = x.view(batch, rows, -1, self.shape.head_dim)
        norm = getattr(attention, norm_name, None)  # QK-norm exists on Qwen3 families only
        if norm is not None:
            x = norm(x)
        x = x.transpose(1, 2)  # [B, heads, S, D_h]
        return x * cos[:, None] + rotate_half(x) * sin[:, None]


def _layer_mask_kinds(config, num_layers: int) -> list[str]:
    layer_types = getattr(config, "layer_types", None)
    if layer_types:
        return list(layer_types[:num_layers])
    kind = "sliding_attention" if getattr(config, "sliding_window", None) else "full_attention"
    return [kind] * num_layers

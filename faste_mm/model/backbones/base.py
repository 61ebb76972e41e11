"""Backbone adapter interface: the only code that knows a model family. The runner drives the
decoder through it (embed, per-layer masks, layers, final norm) and compressor policies use it
for readout scoring (each layer's own input norm, q/k projections, QK-norm and RoPE).
"""

from __future__ import annotations

import torch
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

from faste_mm.model.cpu.decoder_kernels import DecoderMlp
from faste_mm.model.cpu.machine import read_cpu_flags
from faste_mm.model.batching import Batch
from faste_mm.model.decoder_state import DecoderState, PackedState
from faste_mm.model.flops import DecoderShape, VisionShape
from faste_mm.model.serialization import Serialized


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Backbone:
    """Shared mechanics of HF decoder stacks (`layers`, `norm`, `rotary_emb`, `embed_tokens`).

    Subclasses implement `embed` (and, for DeepStack, `after_layer`).
    """

    family: str = ""
    vision_shape: VisionShape | None = None  # set by backbones with a vision tower (FLOPs accounting)

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
        has_sliding = "sliding_attention" in self._mask_kinds
        self._sliding_window = getattr(text_config, "sliding_window", None) if has_sliding else None
        # layers of exactly the pre-norm shape `finish_layer` spells out (others run as HF's module)
        self._plain_layers = [_is_plain_layer(layer) for layer in self.layers]
        self.mlp = DecoderMlp(read_cpu_flags())  # the MLP block and its residual, fused or not by trial

    @property
    def device(self) -> torch.device:
        return self.decoder.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.decoder.embed_tokens.weight.dtype

    @property
    def embedding_dim(self) -> int:
        return self.shape.hidden

    def encode_vision(self, batch: Batch):
        """The vision tower's features for the batch (backbones with a tower), else None; the
        runner times it as its own stage and hands the result to `embed`."""
        return None

    def embed(self, batch: Batch, vision=None) -> DecoderState:
        """The decoder's input state: token embeddings (with `encode_vision`'s features)."""
        raise NotImplementedError

    def with_positions(self, item: Serialized) -> Serialized:
        """Per-item position ids computed in the preprocessing workers (CPU, overlapped with the
        model); plain decoders count 0..T-1 in `embed` and need none."""
        return item

    def attention_masks(self, state: DecoderState) -> dict[str, torch.Tensor | None]:
        """The 4-D masks HF's own forward would build for this padding, one per attention kind."""
        kwargs = dict(
            config=self.text_config,
            inputs_embeds=state.hidden,
            attention_mask=state.valid,
            cache=None,  # transformers >= 5.24 (past_key_values is deprecated there, removed in 5.40)
            position_ids=None,  # gapped ids after compression would read as packed sequences
        )
        masks: dict[str, torch.Tensor | None] = {}
        for kind in set(self._mask_kinds):
            build = create_sliding_window_causal_mask if kind == "sliding_attention" else create_causal_mask
            masks[kind] = build(**kwargs)
        return masks

    def run_layer(self, index: int, state: DecoderState, masks: dict) -> torch.Tensor:
        """Layer `index` on padded rows: HF's decoder layer, spelled out (as transformers writes it)
        where its shape is the plain pre-norm one, so its MLP and residual run as `self.mlp` settles."""
        layer = self.layers[index]
        if self._plain_layers[index]:
            attended, _ = layer.self_attn(hidden_states=layer.input_layernorm(state.hidden),
                                          attention_mask=masks[self._mask_kinds[index]],
                                          position_embeddings=(state.cos, state.sin), position_ids=None)
            return self._finish_mlp(index, state.hidden + attended)
        return layer(
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

    # The controller's projections run in the model's dtype (as the layer's own); the rotation and
    # everything after it is float32, so a bfloat16 model ranks the prefix without 8-bit rounding.

    def project_queries(self, index: int, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """[B, S, H] hidden rows -> [B, A, S, D_h] float32 rotated queries of layer `index`."""
        layer = self.layers[index]
        normed = layer.input_layernorm(hidden)
        return self._heads(layer.self_attn, normed, cos, sin, "q_proj", "q_norm", torch.float32).transpose(1, 2)

    def project_keys(self, index: int, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """[B, T, H] hidden -> [B, A_kv, T, D_h] float32 rotated keys of layer `index`."""
        layer = self.layers[index]
        normed = layer.input_layernorm(hidden)
        return self._heads(layer.self_attn, normed, cos, sin, "k_proj", "k_norm", torch.float32).transpose(1, 2)

    def attention_scale(self, index: int) -> float:
        return float(self.layers[index].self_attn.scaling)

    def _heads(self, attention, x, cos, sin, proj_name: str, norm_name: str, rotate_in: torch.dtype | None = None) -> torch.Tensor:
        """[..., S, H] normed hidden -> [..., S, heads, D_h]: projection, QK-norm, RoPE (in
        `rotate_in`, default the model's dtype as the layer itself rotates)."""
        x = getattr(attention, proj_name)(x)
        x = x.view(*x.shape[:-1], -1, self.shape.head_dim)
        norm = getattr(attention, norm_name, None)  # QK-norm exists on Qwen3 families only
        if norm is not None:
            x = norm(x)
        if rotate_in is not None:
            x, cos, sin = x.to(rotate_in), cos.to(rotate_in), sin.to(rotate_in)
        cos, sin = cos[..., None, :], sin[..., None, :]  # broadcast over heads
        return x * cos + rotate_half(x) * sin

    # -- the layers after compression without padding (faste_mm.model.unpadded) --

    def can_pack(self, width: int) -> bool:
        """Whether a batch of rows at most `width` long may run unpadded: sliding-window layers
        equal plain causal attention only while no row is longer than the window."""
        return self._sliding_window is None or width <= self._sliding_window

    def run_layer_packed(self, index: int, state: PackedState, attend) -> torch.Tensor:
        """Layer `index` on packed tokens: the HF decoder layer's computation, spelled out, with
        variable-length attention `attend(q, k, v, state, scale)` in place of the masked one."""
        layer = self.layers[index]
        attention = layer.self_attn
        q, k, v = self.layer_qkv(index, state.hidden, state.cos, state.sin)  # [N, A | A_kv, D_h]
        attended = attend(q, k, v, state, attention.scaling)  # [N, A, D_h]
        return self.finish_layer(index, state.hidden, attended)

    def layer_qkv(self, index: int, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Layer `index`'s attention inputs for [..., S, H] hidden rows, as the HF layer makes them
        (input norm, projections, QK-norm, RoPE in the model's dtype): q [..., S, A, D_h], k and v
        [..., S, A_kv, D_h]. With `finish_layer`, the layer spelled out around any attention call."""
        attention = self.layers[index].self_attn
        x = self.layers[index].input_layernorm(hidden)
        q = self._heads(attention, x, cos, sin, "q_proj", "q_norm")
        k = self._heads(attention, x, cos, sin, "k_proj", "k_norm")
        v = attention.v_proj(x).view(*x.shape[:-1], -1, self.shape.head_dim)
        return q, k, v

    def finish_layer(self, index: int, hidden: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """The rest of layer `index` after attention: o_proj and the residual, then the MLP block.
        attended [..., S, A, D_h] -> the layer's output hidden [..., S, H]."""
        hidden = hidden + self.layers[index].self_attn.o_proj(attended.flatten(-2))
        return self._finish_mlp(index, hidden)

    def _finish_mlp(self, index: int, hidden: torch.Tensor) -> torch.Tensor:
        """hidden + the MLP block of layer `index` on its post-attention norm."""
        layer = self.layers[index]
        return self.mlp(layer.mlp, layer.post_attention_layernorm(hidden), hidden)


def _is_plain_layer(layer: torch.nn.Module) -> bool:
    """Whether a decoder layer is exactly input norm -> attention -> residual -> post-attention norm
    -> MLP -> residual (Qwen2/3, Llama): no other submodule (e.g. Gemma's extra norms)."""
    names = {name for name, _ in layer.named_children()}
    return names == {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"}


def _layer_mask_kinds(config, num_layers: int) -> list[str]:
    layer_types = getattr(config, "layer_types", None)
    if layer_types:
        return list(layer_types[:num_layers])
    kind = "sliding_attention" if getattr(config, "sliding_window", None) else "full_attention"
    return [kind] * num_layers

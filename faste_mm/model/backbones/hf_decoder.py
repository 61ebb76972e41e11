"""Generic adapter for decoder-only text embedding models built on HF's Llama-style stacks
(Qwen3 for Qwen3-Embedding, Mistral for E5-Mistral, Llama, Qwen2): 1-D RoPE, no vision tower.
"""

from __future__ import annotations

import torch

from faste_mm.model.backbones.base import Backbone
from faste_mm.model.batching import Batch
from faste_mm.model.decoder_state import DecoderState


class HFDecoderBackbone(Backbone):
    family = "hf_decoder"

    def __init__(self, model) -> None:  # model: e.g. transformers Qwen3Model / MistralModel
        super().__init__(model, model, model.config)

    def embed(self, batch: Batch, vision=None) -> DecoderState:  # no vision tower: `vision` is always None
        input_ids = batch.input_ids
        hidden = self.decoder.embed_tokens(input_ids)  # [B, T, H]
        # Right padding: valid tokens sit at 0..len-1, exactly the positions HF assigns; rows that
        # continue a reused prefix (rerankers) bring their own (the three MRoPE axes are equal here)
        if batch.position_ids is not None:
            position_ids = batch.position_ids[0]
        else:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        cos, sin = self.decoder.rotary_emb(hidden, position_ids)  # [B, T, D_h]
        return DecoderState(
            hidden=hidden,
            cos=cos,
            sin=sin,
            valid=batch.valid,
            lengths=batch.lengths,
            source_index=position_ids,
        )

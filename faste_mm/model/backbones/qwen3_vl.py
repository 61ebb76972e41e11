"""Qwen3-VL adapter: image and video features scattered into the token embeddings, interleaved MRoPE
positions from the model's own `get_rope_index` (per item, in the preprocessing workers), and DeepStack injections after decoder layers
0..k-1, driven token-by-token through `DecoderState.visual_rank` so they survive compression.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from faste_mm.model.backbones.base import Backbone
from faste_mm.model.batching import Batch
from faste_mm.model.decoder_state import DecoderState
from faste_mm.model.flops import VisionShape
from faste_mm.model.serialization import Serialized


class Qwen3VLBackbone(Backbone):
    family = "qwen3_vl"

    def __init__(self, model) -> None:  # model: transformers Qwen3VLModel
        super().__init__(model, model.language_model, model.config.text_config)
        self.image_token_id = model.config.image_token_id
        self.video_token_id = model.config.video_token_id
        vision = model.config.vision_config
        self.vision_shape = VisionShape(
            depth=vision.depth,
            hidden=vision.hidden_size,
            intermediate=vision.intermediate_size,
            patch_dim=vision.in_channels * vision.temporal_patch_size * vision.patch_size**2,
            merge=vision.spatial_merge_size**2,
            out_hidden=vision.out_hidden_size,
            mergers=1 + len(vision.deepstack_visual_indexes),
        )

    def embed(self, batch: Batch) -> DecoderState:
        input_ids = batch.input_ids
        hidden = self.decoder.embed_tokens(input_ids)  # [B, T, H]
        visual_rank = None
        deepstack = None
        visuals = []  # (token mask, features) per modality, images first, as Qwen3VLModel scatters them
        if batch.pixel_values is not None:
            vision = self.model.get_image_features(batch.pixel_values, batch.image_grid_thw, return_dict=True)
            visuals.append((input_ids == self.image_token_id, vision))
        if batch.pixel_values_videos is not None:
            vision = self.model.get_video_features(batch.pixel_values_videos, batch.video_grid_thw, return_dict=True)
            visuals.append((input_ids == self.video_token_id, vision))
        if visuals:
            visual_rank = torch.full_like(input_ids, -1)  # [B, T]
            offset = 0
            for mask, vision in visuals:
                embeds = torch.cat(vision.pooler_output).to(hidden.dtype)  # [n_visual, H]
                if embeds.shape[0] != int(mask.sum()):
                    raise RuntimeError(  # an invariant of the serializer, not reachable from user input
                        f"{embeds.shape[0]} visual features for {int(mask.sum())} placeholder tokens"
                    )
                hidden = hidden.masked_scatter(mask[..., None], embeds)
                # rank of each token of this modality in row-major order = its row in the DeepStack
                # features; the second modality's rows follow the first's in the concatenation
                ranks = torch.cumsum(mask.flatten(), 0).view_as(mask) - 1 + offset
                visual_rank = torch.where(mask, ranks, visual_rank)
                offset += embeds.shape[0]
            deepstack = tuple(
                torch.cat([feature for _, vision in visuals for feature in vision.deepstack_features[level]]).to(hidden.dtype)
                for level in range(len(visuals[0][1].deepstack_features))
            )
            position_ids = batch.position_ids  # [3, B, T], from the workers (with_positions)
            if position_ids is None:  # batches built elsewhere (the sentence-transformers wrapper)
                position_ids, _ = self.model.get_rope_index(
                    input_ids,
                    mm_token_type_ids=batch.mm_token_type_ids,
                    image_grid_thw=batch.image_grid_thw,
                    video_grid_thw=batch.video_grid_thw,
                    attention_mask=batch.valid.long(),
                )
        else:
            width = input_ids.shape[1]
            position_ids = torch.arange(width, device=input_ids.device).view(1, 1, -1).expand(3, input_ids.shape[0], -1)
        cos, sin = self.decoder.rotary_emb(hidden, position_ids)  # [B, T, D_h] each
        return DecoderState(
            hidden=hidden,
            cos=cos,
            sin=sin,
            valid=batch.valid,
            lengths=batch.lengths,
            source_index=torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids),
            visual_rank=visual_rank,
            deepstack=deepstack,
        )

    def with_positions(self, item: Serialized) -> Serialized:
        """MRoPE positions of one item with an image or a video, by the model's own
        `get_rope_index` (a Python loop with host reads per row: on CPU in a worker it costs the
        GPU nothing). A video's frame pairs each start a new temporal group after their
        `<t seconds>` text, which get_rope_index handles from video_grid_thw."""
        if item.image_grid_thw is None and item.video_grid_thw is None:
            return item
        position_ids, _ = self.model.get_rope_index(
            item.input_ids[None],
            mm_token_type_ids=item.mm_token_type_ids[None],
            image_grid_thw=item.image_grid_thw,
            video_grid_thw=item.video_grid_thw,
        )  # [3, 1, T]
        return replace(item, position_ids=position_ids[:, 0])

    def after_layer(self, index: int, state: DecoderState) -> DecoderState:
        """DeepStack: add vision block features to the visual tokens after layers 0..k-1."""
        if state.deepstack is None or index >= len(state.deepstack):
            return state
        # gathered for every slot and selected by the mask: boolean indexing would sync with the
        # host (nonzero) inside the layer loop; works on padded [B, T] and packed [N] states alike
        features = state.deepstack[index][state.visual_rank.clamp(min=0)]  # [..., H]
        hidden = torch.where(state.visual_mask[..., None], state.hidden + features, state.hidden)
        return state.with_hidden(hidden)

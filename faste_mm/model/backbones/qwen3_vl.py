"""Qwen3-VL adapter: image and video features (one packed vision-tower call per batch:
`vision_tower.PackedVisionTower`) scattered into the token embeddings, interleaved MRoPE
positions from the model's own `get_rope_index` (per item, in the preprocessing workers), and DeepStack injections after decoder layers
0..k-1, driven token-by-token through `DecoderState.visual_rank` so they survive compression.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from faste_mm.model.backbones.base import Backbone
from faste_mm.model.backbones.vision_tower import KeptPatches, PackedVisionTower, VisionFeatures
from faste_mm.model.batching import Batch
from faste_mm.model.decoder_state import DecoderState
from faste_mm.model.flops import VisionShape
from faste_mm.model.serialization import MERGE_UNIT, Serialized


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
        self.tower = PackedVisionTower(model.visual)

    def encode_vision(self, batch: Batch) -> VisionFeatures | None:
        """The vision tower on every image and video of the batch, in ONE packed call (images
        first, then videos: the order Qwen3VLModel scatters them in); None without pixels."""
        pixels = [p for p in (batch.pixel_values, batch.pixel_values_videos) if p is not None]
        if not pixels:
            return None
        grids = [g for g in (batch.image_grid_thw, batch.video_grid_thw) if g is not None]
        dtype = self.model.visual.patch_embed.proj.weight.dtype
        return self.tower(torch.cat(pixels).to(dtype), torch.cat(grids), kept_patches(batch))

    def embed(self, batch: Batch, vision: VisionFeatures | None = None) -> DecoderState:
        """Token embeddings with the visual features scattered in; `vision` is this batch's
        `encode_vision` output (computed here when not given)."""
        input_ids = batch.input_ids
        hidden = self.decoder.embed_tokens(input_ids)  # [B, T, H]
        visual_rank = None
        deepstack = None
        if vision is None:
            vision = self.encode_vision(batch)
        if vision is not None:
            # image tokens take the first merged rows, video tokens the rest; a token's rank in
            # that order is its row in the merged and DeepStack features
            n_image = sum(vision.sizes[: 0 if batch.image_grid_thw is None else len(batch.image_grid_thw)])
            image_mask = input_ids == self.image_token_id  # [B, T]
            video_mask = input_ids == self.video_token_id
            if n_image != int(image_mask.sum()) or vision.merged.shape[0] - n_image != int(video_mask.sum()):
                raise RuntimeError(  # an invariant of the serializer, not reachable from user input
                    f"{vision.merged.shape[0]} visual features for {int(image_mask.sum())} image and "
                    f"{int(video_mask.sum())} video placeholder tokens"
                )
            image_rank = torch.cumsum(image_mask.flatten(), 0).view_as(image_mask) - 1
            video_rank = torch.cumsum(video_mask.flatten(), 0).view_as(video_mask) - 1 + n_image
            visual_rank = torch.where(image_mask, image_rank, torch.where(video_mask, video_rank, -1))  # [B, T]
            visual = visual_rank >= 0
            features = vision.merged.to(hidden.dtype)[visual_rank.clamp(min=0)]  # [B, T, H]
            hidden = torch.where(visual[..., None], features, hidden)
            deepstack = tuple(level.to(hidden.dtype) for level in vision.deepstack)
            position_ids = batch.position_ids  # [3, B, T], from the workers (with_positions)
            if position_ids is None:  # batches built elsewhere (the sentence-transformers wrapper)
                position_ids, _ = self.model.get_rope_index(
                    input_ids,
                    mm_token_type_ids=batch.mm_token_type_ids,
                    image_grid_thw=batch.image_grid_thw,
                    video_grid_thw=batch.video_grid_thw,
                    attention_mask=batch.valid.long(),
                )
        elif batch.position_ids is not None:  # text rows that do not start at 0 (a reranker's pairs after a reused prefix)
            position_ids = batch.position_ids
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


def kept_patches(batch: Batch) -> KeptPatches | None:
    """The tower's view of a batch whose images dropped repeated units (`Batch.kept_patches`):
    the kept rows of the images' full patch sequence, then every video patch after them; one
    attention frame per image (its kept patches) and per video frame. None without dedup."""
    if batch.kept_patches is None:
        return None
    full_image_patches = sum(t * h * w for t, h, w in batch.image_grids)
    sizes = list(batch.tower_units)
    index, lengths = [batch.kept_patches], [units * MERGE_UNIT for units in sizes]
    video_patches = sum(t * h * w for t, h, w in batch.video_grids)
    if video_patches:
        device = batch.kept_patches.device
        index.append(torch.arange(full_image_patches, full_image_patches + video_patches, device=device))
        lengths += [h * w for t, h, w in batch.video_grids for _ in range(t)]
        sizes += [t * h * w // MERGE_UNIT for t, h, w in batch.video_grids]
    return KeptPatches(torch.cat(index), lengths, sizes)

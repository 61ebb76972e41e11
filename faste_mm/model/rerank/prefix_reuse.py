"""Prefix reuse for reranker pairs: every pair of one query starts with the same tokens (system
turn, `<Instruct>: ...`, `<Query>:` and the query), and in a causal decoder their states never see
the document. So their per-layer keys and values are computed ONCE per query (`encode_prefix`) and
each batch runs only the document part of its pairs (`cut_pair`) against them (`run_with_prefix`).

Exactness, per policy (docs/rerank.md "Prefix reuse"):
- full forward: the prefix's states are the same in every pair at every layer: reused throughout;
- FastE with protect="query": the prefix is never evicted, so after the trigger its states still
  see only themselves: reused throughout (the controller sees the whole pair, prefix included);
- plain FastE: the trigger may evict prefix positions per pair; after it a pair's prefix states
  depend on what that pair kept, so the prefix is reused up to the trigger, then joined into each
  row and the remaining layers run on whole pairs as in `runner.run_decoder`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from faste_mm.model.batching import Batch, collate
from faste_mm.model.decoder_state import DecoderState
from faste_mm.model.faste import first_checked_layer
from faste_mm.model.runner import BatchTrace, compressed_layout, elapsed_s, step_layer
from faste_mm.model.serialization import Serialized
from faste_mm.model.unpadded import PADDED, PackedKernel


class PrefixMismatch(Exception):
    """A pair whose first tokens are not the query's shared prefix (truncation cut into the query):
    the caller scores it on the whole-pair path."""


@dataclass(frozen=True, slots=True)
class PrefixCache:
    """One query's shared prefix: S tokens and, per layer, what the document part needs from them.

    keys / values: per layer [1, A_kv, S, D_h], the layer's own rotated keys and values;
    hidden: per layer the [1, S, H] input of that layer, kept only from the first layer a
    compressing policy may inspect (None before it): the controller sees whole pairs.
    """

    input_ids: torch.Tensor  # [S]
    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]
    hidden: tuple[torch.Tensor | None, ...]
    cos: torch.Tensor  # [1, S, D_h]
    sin: torch.Tensor  # [1, S, D_h]
    image_patches: int  # the query's image / video patches at the front of each pair's pixels
    video_patches: int
    has_visual: bool  # the query has visual tokens (their DeepStack features are not kept)
    deepstack_layers: int  # decoder layers after which DeepStack injects (0 without vision)

    @property
    def length(self) -> int:
        return int(self.input_ids.shape[0])


def first_asked_layer(config, num_layers: int) -> int | None:
    """The first layer before which FastE with this resolved config may look at (or change) the
    state; None for the full forward (config None)."""
    if config is None:
        return None
    if config.trigger_layer is not None:
        return config.trigger_layer
    return first_checked_layer(config.warmup_layer, num_layers)


def _asks(config, layer: int, first: int | None) -> bool:
    if first is None:
        return False
    return layer == first if config.trigger_layer is not None else layer >= first


def _patches(grid: torch.Tensor | None) -> int:
    return 0 if grid is None else int(grid[0].prod())


def prefix_of(pair: Serialized, shared: int, query_image: bool, query_video: bool) -> Serialized:
    """The first `shared` tokens of a pair (with the query's own image / video patches)."""
    image = _patches(pair.image_grid_thw) if query_image else 0
    video = _patches(pair.video_grid_thw) if query_video else 0
    return Serialized(
        input_ids=pair.input_ids[:shared],
        mm_token_type_ids=None if pair.mm_token_type_ids is None else pair.mm_token_type_ids[:shared],
        pixel_values=pair.pixel_values[:image] if image else None,
        image_grid_thw=pair.image_grid_thw[:1] if image else None,
        position_ids=None if pair.position_ids is None else pair.position_ids[:, :shared],
        pixel_values_videos=pair.pixel_values_videos[:video] if video else None,
        video_grid_thw=pair.video_grid_thw[:1] if video else None,
    )


def cut_pair(pair: Serialized, cache: PrefixCache) -> Serialized:
    """The document part of a pair (tokens S.., the document's own media, positions continuing
    the prefix's); PrefixMismatch when the pair does not start with the cached prefix."""
    shared = cache.length
    if pair.protected != shared or pair.length <= shared or not torch.equal(pair.input_ids[:shared], cache.input_ids):
        raise PrefixMismatch(f"the pair does not start with the query's {shared} shared tokens")
    positions = pair.position_ids
    if positions is None:  # text pairs count on from the prefix
        positions = torch.arange(shared, pair.length).expand(3, -1)
    n_images = 0 if pair.image_grid_thw is None else pair.image_grid_thw.shape[0] - (1 if cache.image_patches else 0)
    n_videos = 0 if pair.video_grid_thw is None else pair.video_grid_thw.shape[0] - (1 if cache.video_patches else 0)
    return Serialized(
        input_ids=pair.input_ids[shared:],
        mm_token_type_ids=None if pair.mm_token_type_ids is None else pair.mm_token_type_ids[shared:],
        pixel_values=pair.pixel_values[cache.image_patches:] if n_images else None,
        image_grid_thw=pair.image_grid_thw[-n_images:] if n_images else None,
        truncated=pair.truncated,
        position_ids=positions[:, shared:] if pair.position_ids is not None else positions,
        pixel_values_videos=pair.pixel_values_videos[cache.video_patches:] if n_videos else None,
        video_grid_thw=pair.video_grid_thw[-n_videos:] if n_videos else None,
    )


def _attend(backbone, layer: int, state: DecoderState, past_k, past_v):
    """Layer `layer` on right-padded rows whose keys are preceded by the prefix's (past_k/v
    [1, A_kv, S, D_h], S may be 0). Returns (hidden, k, v).

    The S prefix positions get placeholder queries so the attention is square and plain causal:
    each document token sees every prefix key and its row's earlier keys, a row's padding comes
    after its valid keys, so no mask is needed and SDPA keeps its fast causal kernel (an explicit
    [T, S + T] mask sends CPUs to the slow path, measured 1.6x slower on 2,000-token pairs)."""
    q, k, v = backbone.layer_qkv(layer, state.hidden, state.cos, state.sin)  # [B, T, A | A_kv, D_h]
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))  # [B, heads, T, D_h]
    rows, shared = q.shape[0], past_k.shape[2]
    keys = torch.cat([past_k.expand(rows, -1, -1, -1), k], dim=2)  # [B, A_kv, S + T, D_h]
    values = torch.cat([past_v.expand(rows, -1, -1, -1), v], dim=2)
    if shared:
        q = torch.cat([q.new_zeros((rows, q.shape[1], shared, q.shape[3])), q], dim=2)  # [B, A, S + T, D_h]
    scale = backbone.layers[layer].self_attn.scaling
    attended = F.scaled_dot_product_attention(q, keys, values, is_causal=True, scale=scale, enable_gqa=True)
    return backbone.finish_layer(layer, state.hidden, attended[:, :, shared:].transpose(1, 2)), k, v


@torch.inference_mode()
def encode_prefix(backbone, prefix: Serialized, pad_token_id: int, keep_hidden_from: int | None, encode_vision) -> PrefixCache:
    """Run the shared prefix alone through every layer once, keeping each layer's keys and
    values (and its input hidden states from layer `keep_hidden_from` on)."""
    batch = collate([prefix], [0], pad_token_id).to(backbone.device)
    state = backbone.embed(batch, encode_vision(batch))
    shared = prefix.length
    empty = state.hidden.new_zeros((1, backbone.shape.kv_heads, 0, backbone.shape.head_dim))
    keys, values, hidden = [], [], []
    for layer in range(len(backbone.layers)):
        hidden.append(state.hidden if keep_hidden_from is not None and layer >= keep_hidden_from else None)
        out, k, v = _attend(backbone, layer, state, empty, empty)
        keys.append(k)
        values.append(v)
        state = backbone.after_layer(layer, state.with_hidden(out))
    return PrefixCache(
        input_ids=prefix.input_ids, keys=tuple(keys), values=tuple(values), hidden=tuple(hidden),
        cos=state.cos, sin=state.sin,
        image_patches=0 if prefix.pixel_values is None else prefix.pixel_values.shape[0],
        video_patches=0 if prefix.pixel_values_videos is None else prefix.pixel_values_videos.shape[0],
        has_visual=state.visual_rank is not None and bool((state.visual_rank >= 0).any()),
        deepstack_layers=0 if state.deepstack is None else len(state.deepstack),
    )


def join(cache: PrefixCache, layer: int, state: DecoderState, earlier: DecoderState | None = None) -> DecoderState:
    """Whole pairs before `layer`: the prefix's states in front of each row of the document part
    (the prefix's visual tokens marked non-visual: only used past DeepStack's layers). `earlier`:
    this join at an earlier layer of the same rows (no gather since): before a trigger only the
    hidden states move on, so the positions, masks and maps are taken from it, not rebuilt."""
    rows, shared = state.hidden.shape[0], cache.length

    def front(prefix: torch.Tensor, rest: torch.Tensor) -> torch.Tensor:
        return torch.cat([prefix.expand(rows, *prefix.shape[1:]), rest], dim=1)

    hidden = front(cache.hidden[layer], state.hidden)
    if earlier is not None:
        return earlier.with_hidden(hidden)
    width = state.hidden.shape[1]
    visual_rank = None
    if state.visual_rank is not None:
        visual_rank = front(state.visual_rank.new_full((1, shared), -1), state.visual_rank)
    return DecoderState(
        hidden=hidden,
        cos=front(cache.cos, state.cos),
        sin=front(cache.sin, state.sin),
        valid=front(state.valid.new_ones((1, shared)), state.valid),
        lengths=state.lengths + shared,
        source_index=torch.arange(shared + width, device=state.hidden.device).expand(rows, -1),
        visual_rank=visual_rank,
        deepstack=state.deepstack,
    )


def split(state: DecoderState, shared: int) -> DecoderState:
    """The document part of whole-pair rows whose first `shared` slots are the prefix."""
    return DecoderState(
        hidden=state.hidden[:, shared:], cos=state.cos[:, shared:], sin=state.sin[:, shared:],
        valid=state.valid[:, shared:], lengths=state.lengths - shared, source_index=state.source_index[:, shared:] - shared,
        visual_rank=None if state.visual_rank is None else state.visual_rank[:, shared:], deepstack=state.deepstack,
    )


@torch.inference_mode()
def run_with_prefix(backbone, cache: PrefixCache, batch: Batch, policy, kernel: PackedKernel | None, readout, encode_vision):
    """`runner.run_decoder` for the document parts of pairs (`cut_pair`) after a cached prefix:
    returns (readout [B], BatchTrace) with the shapes of whole pairs in the trace's token counts.

    The policy is asked with whole pairs (`join`), so FastE's alignment and ranking see exactly
    what they see without reuse; a policy that `keeps_prefix` (protect="query") keeps the prefix
    cached after the trigger, otherwise the rows go on as whole pairs."""
    started = time.perf_counter()
    vision = encode_vision(batch)
    tower_s = 0.0 if vision is None else elapsed_s(started, batch.input_ids.device)
    started = time.perf_counter()
    state = backbone.embed(batch, vision)
    shared = cache.length
    config = policy.config if policy.compresses else None
    first = first_asked_layer(config, len(backbone.layers))
    prefix_tokens = state.lengths - 1 + shared
    kept_prefix = prefix_tokens
    padded_lengths: list[int] = []
    alignment: list[tuple[int, float]] = []
    trigger_layer = None
    joined = None  # the whole pairs the policy was last asked with (their layout is built once)
    whole = None  # after a trigger that may evict the prefix: (masks, packed kernel) of whole-pair rows
    width = 0  # the whole-pair rows' padded width after that trigger
    for layer in range(len(backbone.layers)):
        if trigger_layer is None and _asks(config, layer, first):
            pairs = joined = join(cache, layer, state, joined)
            decision = policy.before_layer(layer, pairs, backbone)
            if decision.alignment is not None:
                alignment.append((layer, decision.alignment))
            if decision.plan is not None:
                pairs = pairs.gather(decision.plan.index, decision.plan.lengths)
                kept_prefix = decision.plan.lengths - 1
                trigger_layer = layer
                if policy.keeps_prefix:  # the plan starts with the S prefix slots of every row
                    state = split(pairs, shared)
                else:  # on as whole pairs, laid out as run_decoder lays out compressed rows
                    width = int(pairs.hidden.shape[1])
                    state, masks, packed = compressed_layout(backbone, pairs, kernel)
                    whole = (masks, packed)
        if whole is None:
            padded_lengths.append(shared + int(state.hidden.shape[1]))
            hidden, _, _ = _attend(backbone, layer, state, cache.keys[layer], cache.values[layer])
            state = backbone.after_layer(layer, state.with_hidden(hidden))
        else:
            padded_lengths.append(width)
            state = step_layer(backbone, layer, state, *whole)
    out = readout(backbone, state.readout_hidden())
    trace = BatchTrace(
        batch_size=batch.size, rows=list(batch.rows), padded_lengths=padded_lengths, trigger_layer=trigger_layer,
        prefix_tokens=int(prefix_tokens.sum()), kept_prefix_tokens=int(kept_prefix.sum()), alignment=alignment,
        attention=PADDED if whole is None or whole[1] is None else whole[1].name,
        image_grids=list(batch.image_grids), video_grids=list(batch.video_grids),
        tower_s=tower_s, decoder_s=elapsed_s(started, out.device),
    )
    return out, trace


def reusable(cache: PrefixCache, config, keeps_prefix: bool, num_layers: int) -> bool:
    """Whether FastE with `config` (None: the full forward) runs exactly on pairs after this
    prefix: a policy that may evict the query before DeepStack's last injection would need the
    query's visual features in every row, which the cache does not keep."""
    first = first_asked_layer(config, num_layers)
    if first is None or keeps_prefix or not cache.has_visual:
        return True
    return first >= cache.deepstack_layers


def with_protected(batch: Batch, shared: int) -> Batch:
    """The document-part batch as the policy sees its whole pairs: every row protects the prefix."""
    return replace(batch, protected=torch.full((batch.size,), shared, dtype=torch.long, device=batch.input_ids.device))

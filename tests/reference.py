"""Deliberately naive references, independent of faste_mm's runner, ranking and batching:
each sample runs ALONE through the HF model's own modules, and FastE literally deletes tokens
with Python lists at the trigger layer. Slow and simple on purpose.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _causal_mask(n: int) -> torch.Tensor:
    mask = torch.full((n, n), float("-inf")).triu(1)
    return mask[None, None]  # [1, 1, n, n]


class _Sample:
    """One sample's hidden states, rotary tables and DeepStack bookkeeping."""

    def __init__(self, hidden, cos, sin, visual, deepstack):
        self.hidden, self.cos, self.sin = hidden, cos, sin  # [1, n, H], [1, n, D]
        self.visual = visual  # list[bool] per token
        self.deepstack = deepstack  # list per DeepStack layer of [n_visual, H] in token order

    def keep(self, positions: list[int]) -> None:
        visual_positions = [p for p in range(len(self.visual)) if self.visual[p]]
        kept_visual = [visual_positions.index(p) for p in positions if self.visual[p]]
        self.hidden = self.hidden[:, positions]
        self.cos, self.sin = self.cos[:, positions], self.sin[:, positions]
        self.visual = [self.visual[p] for p in positions]
        self.deepstack = [feat[kept_visual] for feat in self.deepstack]


def init_vl_sample(model, serialized) -> _Sample:
    """Qwen3VLModel pieces for one unpadded sample: embeddings, vision scatter (image, then video),
    MRoPE, DeepStack features listed in token order."""
    text = model.language_model
    ids = serialized.input_ids[None]
    hidden = text.embed_tokens(ids)
    kinds = []  # (token id, pixels, grid, feature function)
    if serialized.pixel_values is not None:
        kinds.append((model.config.image_token_id, serialized.pixel_values, serialized.image_grid_thw, model.get_image_features))
    if getattr(serialized, "pixel_values_videos", None) is not None:
        kinds.append((model.config.video_token_id, serialized.pixel_values_videos, serialized.video_grid_thw, model.get_video_features))
    visual = [False] * ids.shape[1]
    by_position = {}  # token position -> its DeepStack rows, one per level
    for token_id, pixels, grid, features in kinds:
        out = features(pixels, grid, return_dict=True)
        mask = ids[0] == token_id
        hidden = hidden.masked_scatter(mask[None, :, None], torch.cat(out.pooler_output))
        levels = [torch.cat(f) for f in out.deepstack_features]
        for rank, position in enumerate(mask.nonzero()[:, 0].tolist()):
            visual[position] = True
            by_position[position] = [level[rank] for level in levels]
    deepstack = []
    if by_position:
        order = sorted(by_position)
        deepstack = [torch.stack([by_position[p][k] for p in order]) for k in range(len(by_position[order[0]]))]
    if kinds:
        position_ids, _ = model.get_rope_index(
            ids,
            mm_token_type_ids=serialized.mm_token_type_ids[None],
            image_grid_thw=serialized.image_grid_thw,
            video_grid_thw=getattr(serialized, "video_grid_thw", None),
        )
    else:
        position_ids = torch.arange(ids.shape[1]).view(1, 1, -1).expand(3, 1, -1)
    cos, sin = text.rotary_emb(hidden, position_ids)
    return _Sample(hidden, cos, sin, visual, deepstack)


def init_text_sample(model, serialized) -> _Sample:
    ids = serialized.input_ids[None]
    hidden = model.embed_tokens(ids)
    cos, sin = model.rotary_emb(hidden, torch.arange(ids.shape[1])[None])
    return _Sample(hidden, cos, sin, [False] * ids.shape[1], [])


def naive_readout_scores(layer, sample: _Sample) -> list[float]:
    """Eq. readout-importance with explicit loops over heads (GQA: head h uses KV head h*A_kv//A)."""
    from transformers.models.llama.modeling_llama import rotate_half

    attn = layer.self_attn
    x = layer.input_layernorm(sample.hidden)[0]  # [n, H]
    n, d = x.shape[0], attn.head_dim
    q = attn.q_proj(x[-1:]).view(1, -1, d)  # [1, A, d]
    k = attn.k_proj(x[:-1]).view(n - 1, -1, d)  # [N, A_kv, d]
    if hasattr(attn, "q_norm"):
        q, k = attn.q_norm(q), attn.k_norm(k)
    heads, kv_heads = q.shape[1], k.shape[1]
    cos, sin = sample.cos[0][:, None], sample.sin[0][:, None]  # [n, 1, d]: original positions
    q_rot = (q * cos[-1:] + rotate_half(q) * sin[-1:]).transpose(0, 1)  # [A, 1, d]
    k_rot = (k * cos[:-1] + rotate_half(k) * sin[:-1]).transpose(0, 1)  # [A_kv, N, d]
    total = torch.zeros(n - 1)
    for h in range(heads):
        kv = h * kv_heads // heads
        logits = (k_rot[kv] @ q_rot[h, 0]) / d**0.5  # [N]
        total += logits.softmax(dim=0)
    return (total / heads).tolist()


def alignment(sample: _Sample) -> float:
    h = sample.hidden[0].float()
    return float(F.cosine_similarity(h[-1], h[:-1].mean(dim=0), dim=0))


def naive_embed(layers, norm, samples: list[_Sample], *, r_max=None, warmup=0, theta=2.0, trigger_layer=None):
    """Run samples alone layer by layer; FastE (if r_max is not None) deletes tokens in one shot.

    Returns (unit embeddings [B, H], trigger layer or None, per-layer batch-mean alignment list).
    """
    num_layers = len(layers)
    trigger = None
    curve = []
    for index, layer in enumerate(layers):
        curve.append(sum(alignment(s) for s in samples) / len(samples))
        if r_max is not None and trigger is None:
            if trigger_layer is not None:
                fire = index == trigger_layer
            else:
                fire = index >= min(warmup, num_layers - 1) and (curve[-1] >= theta or index == num_layers - 1)
            if fire:
                trigger = index
                for s in samples:
                    n_prefix = s.hidden.shape[1] - 1
                    budget = max(1, round((1 - r_max) * n_prefix))
                    scores = naive_readout_scores(layer, s)
                    best = sorted(range(n_prefix), key=lambda j: -scores[j])[:budget]
                    s.keep(sorted(best) + [n_prefix])
        for s in samples:
            s.hidden = layer(s.hidden, attention_mask=_causal_mask(s.hidden.shape[1]), position_embeddings=(s.cos, s.sin))
            if index < len(s.deepstack):
                mask = torch.tensor(s.visual)
                s.hidden = s.hidden.clone()
                s.hidden[0, mask] = s.hidden[0, mask] + s.deepstack[index]
    z = torch.stack([norm(s.hidden[0, -1]) for s in samples])
    return F.normalize(z.float(), dim=-1), trigger, curve

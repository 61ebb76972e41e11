"""Deliberately naive references, independent of faste_mm's runner, ranking and batching:
each sample runs ALONE through the HF model's own modules, and FastE literally deletes tokens
with Python lists at the trigger layer. Slow and simple on purpose.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def serialized_items(embedder, inputs, instruction=None) -> list:
    """Each input serialized alone by `embedder`'s serializer (an item's own instruction, else `instruction`)."""
    from faste_mm.model.items import as_item

    items = [as_item(x, i) for i, x in enumerate(inputs)]
    return [embedder.serializer(item, item.instruction or instruction) for item in items]


def pool_last_valid(hidden, mask):
    """The official pooling of an HF forward: the last valid token's state [B, H], L2-normalised."""
    last = mask.sum(dim=1) - 1
    return F.normalize(hidden[torch.arange(hidden.shape[0]), last].float(), dim=-1).numpy()


def right_padded(serialized, pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Serialized items as one right-padded batch for the HF model's own forward: input ids,
    attention mask and mm_token_type_ids (zeros where an item has none), each [B, T]."""
    width = max(s.length for s in serialized)
    ids = torch.full((len(serialized), width), pad_id)
    mask = torch.zeros((len(serialized), width), dtype=torch.long)
    mm = torch.zeros((len(serialized), width), dtype=torch.long)
    for b, s in enumerate(serialized):
        ids[b, : s.length], mask[b, : s.length] = s.input_ids, 1
        if s.mm_token_type_ids is not None:
            mm[b, : s.length] = s.mm_token_type_ids
    return ids, mask, mm


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
    """The keep rule (docs/design.md, Algorithm 1 line 8) with explicit loops over heads (GQA: head h uses KV head h*A_kv//A)."""
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


def naive_embed(layers, norm, samples: list[_Sample], *, r_max=None, warmup=0, theta=2.0, trigger_layer=None, protected=None):
    """Run samples alone layer by layer; FastE (if r_max is not None) deletes tokens in one shot.

    protected: per sample, leading positions that are never deleted (a reranker's query); the
    budget then applies to the rest of the prefix.
    Returns (unit embeddings [B, H], trigger layer or None, per-layer batch-mean alignment list).
    """
    z, trigger, curve = naive_readout(layers, norm, samples, r_max=r_max, warmup=warmup, theta=theta,
                                      trigger_layer=trigger_layer, protected=protected)
    return F.normalize(z.float(), dim=-1), trigger, curve


def naive_readout(layers, norm, samples: list[_Sample], *, r_max=None, warmup=0, theta=2.0, trigger_layer=None, protected=None):
    """`naive_embed` before the L2 normalisation: the final-normed readout states [B, H]."""
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
                for i, s in enumerate(samples):
                    n_prefix = s.hidden.shape[1] - 1
                    keep_always = [] if protected is None else list(range(min(protected[i], n_prefix)))
                    rest = [j for j in range(n_prefix) if j not in keep_always]
                    budget = max(1, round((1 - r_max) * len(rest)))
                    scores = naive_readout_scores(layer, s)
                    best = sorted(rest, key=lambda j: -scores[j])[:budget]
                    s.keep(sorted(keep_always + best) + [n_prefix])
        for s in samples:
            s.hidden = layer(s.hidden, attention_mask=_causal_mask(s.hidden.shape[1]), position_embeddings=(s.cos, s.sin))
            if index < len(s.deepstack):
                mask = torch.tensor(s.visual)
                s.hidden = s.hidden.clone()
                s.hidden[0, mask] = s.hidden[0, mask] + s.deepstack[index]
    return torch.stack([norm(s.hidden[0, -1]) for s in samples]), trigger, curve


# -- the official reranker formats, written from the official code and model card, independent
# of faste_mm.model.rerank.pair_format --

SYSTEM = ('Judge whether the Document meets the requirements based on the Query and the Instruct provided. '
          'Note that the answer can only be "yes" or "no".')


def official_vl_pair_inputs(processor, query: dict, document: dict, instruction: str, max_length: int, fetch_video):
    """Qwen3VLReranker.format_mm_instruction + tokenize for one pair: token ids (list, truncated
    by the official special-token rule) and the processor's pixel tensors. `query`/`document`:
    dicts with optional "text", "image" (path), "video" (path); `fetch_video(path)` -> frames."""
    from qwen_vl_utils import fetch_image

    images, videos = [], []

    def part(obj, label):
        content = [{"type": "text", "text": label}]
        if not obj.get("text") and not obj.get("image") and not obj.get("video"):
            return content + [{"type": "text", "text": "NULL"}]
        if obj.get("video"):
            videos.append(fetch_video(obj["video"]))
            content.append({"type": "video", "video": obj["video"]})
        if obj.get("image"):
            from PIL import Image
            image = obj["image"] if hasattr(obj["image"], "size") else Image.open(obj["image"])
            images.append(fetch_image({"image": image, "min_pixels": 4096, "max_pixels": 1280 * 32 * 32}, image_patch_size=16))
            content.append({"type": "image", "image": obj["image"]})
        if obj.get("text"):
            content.append({"type": "text", "text": obj["text"]})
        return content

    user = [{"type": "text", "text": "<Instruct>: " + instruction}] + part(query, "<Query>:") + part(document, "\n<Document>:")
    messages = [{"role": "system", "content": [{"type": "text", "text": SYSTEM}]}, {"role": "user", "content": user}]
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    text = text.replace("<|vision_start|><|video_pad|><|vision_end|>", "<|video_pad|>")  # transformers 5 (see serialization)
    kwargs = {}
    if videos:
        kwargs = dict(videos=[v.frames for v in videos], video_metadata=[v.metadata() for v in videos], do_sample_frames=False)
    out = processor(text=[text], images=images or None, do_resize=False, return_tensors="pt", **kwargs)
    ids = out["input_ids"][0].tolist()
    special = set(processor.tokenizer.all_special_ids)
    body, tail = ids[:-5], ids[-5:]
    if len(body) > max_length:  # truncate_tokens_optimized
        allowed = max_length - sum(1 for t in body if t in special)
        kept, count = [], 0
        for t in body:
            if t in special:
                kept.append(t)
            elif count < allowed:
                kept.append(t)
                count += 1
        body = kept
    return body + tail, out


def official_vl_scores(lm, processor, pairs_inputs, pad_id: int) -> torch.Tensor:
    """The official compute_scores over a LEFT-padded batch: Qwen3VLModel's last_hidden_state at
    the last column, through Linear(W[yes] - W[no]) and a sigmoid."""
    vocab = processor.tokenizer.get_vocab()
    width = max(len(ids) for ids, _ in pairs_inputs)
    ids = torch.full((len(pairs_inputs), width), pad_id)
    mask = torch.zeros((len(pairs_inputs), width), dtype=torch.long)
    mm = torch.zeros((len(pairs_inputs), width), dtype=torch.long)
    for b, (row, _) in enumerate(pairs_inputs):
        ids[b, width - len(row):] = torch.tensor(row)
        mask[b, width - len(row):] = 1
    mm[ids == lm.config.image_token_id] = 1
    mm[ids == lm.config.video_token_id] = 2
    kwargs = {}
    for key in ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw"):
        parts = [out[key] for _, out in pairs_inputs if out.get(key) is not None]
        if parts:
            kwargs[key] = torch.cat(parts)
    hidden = lm.model(input_ids=ids, attention_mask=mask, mm_token_type_ids=mm, **kwargs).last_hidden_state[:, -1]
    weight = lm.lm_head.weight
    return torch.sigmoid(hidden @ (weight[vocab["yes"]] - weight[vocab["no"]]))


def official_text_scores(lm, tokenizer, query: str, documents: list[str], instruction: str, max_length: int) -> torch.Tensor:
    """The Qwen3-Reranker model card: prefix + tokenized pair (truncated) + suffix, left padding,
    logits of the last position, log_softmax over [no, yes], exp of yes."""
    prefix = f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n"
    suffix = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    prefix_ids = tokenizer.encode(prefix, add_special_tokens=False)
    suffix_ids = tokenizer.encode(suffix, add_special_tokens=False)
    pairs = [f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {doc}" for doc in documents]
    encoded = tokenizer(pairs, padding=False, truncation="longest_first", return_attention_mask=False,
                        max_length=max_length - len(prefix_ids) - len(suffix_ids))
    rows = [prefix_ids + ids + suffix_ids for ids in encoded["input_ids"]]
    tokenizer.padding_side = "left"
    batch = tokenizer.pad({"input_ids": rows}, padding=True, return_tensors="pt")
    tokenizer.padding_side = "right"
    logits = lm(**batch).logits[:, -1, :]
    yes, no = tokenizer.convert_tokens_to_ids("yes"), tokenizer.convert_tokens_to_ids("no")
    return torch.nn.functional.log_softmax(torch.stack([logits[:, no], logits[:, yes]], dim=1), dim=1)[:, 1].exp()

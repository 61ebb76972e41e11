"""Qwen3-VL's vision tower as one packed stage: every image and video of a batch in one sequence
of patches (no padding), attention within each frame only, then the patch merger and the DeepStack
mergers. Receives pixel patches and their (t, h, w) grids; hands on the merged visual tokens and
the DeepStack features the decoder's adapter scatters in (`qwen3_vl.Qwen3VLBackbone.embed`).

It runs the checkpoint's own modules (`patch_embed`, `pos_embed`, `blocks[i].norm1/attn.qkv/
attn.proj/norm2/mlp`, `merger`, `deepstack_merger_list`) in the order of transformers'
`Qwen3VLVisionModel.forward`; only the attention call differs. transformers (sdpa/eager) runs one
attention call per frame in a Python loop; here frames of equal size that lie next to each other
(the photos of a length-sorted batch, the frames of a video) share ONE batched call, and on CUDA
with flash-attn installed the whole packed sequence is one `flash_attn_varlen_func` call.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch
from torch.nn.functional import scaled_dot_product_attention

from faste_mm.model.cpu.machine import read_cpu_flags
from faste_mm.model.cpu.kernel_choice import (TOWER_GELU_ENV, KernelTrials, TrialCache, machine_key,
                                              requested_attention_dtype, requested_gelu)

TOWER_ATTENTION = ("auto", "flash-attn", "sdpa")


@dataclass(frozen=True, slots=True)
class VisionFeatures:
    """The tower's output for a batch: merged tokens of every image/video in input order, and one
    tensor per DeepStack level laid out the same way."""

    merged: torch.Tensor  # [n_merged, H_out]
    deepstack: tuple[torch.Tensor, ...]  # each [n_merged, H_out]
    sizes: list[int]  # merged tokens per image/video, in order


@dataclass(frozen=True, slots=True)
class FrameRuns:
    """The packed sequence cut into attention frames: `runs` are (start, frames, length) for
    consecutive frames of equal length (one batched attention call each); `cu_seqlens` [F + 1]
    int32 and `longest` are the same cut for a variable-length kernel."""

    runs: list[tuple[int, int, int]]
    cu_seqlens: torch.Tensor
    longest: int


def frame_runs(grid_thw: torch.Tensor) -> FrameRuns:
    """Frames (t of h x w patches per image/video) grouped into runs of equal length."""
    runs: list[tuple[int, int, int]] = []
    lengths: list[int] = []
    start = 0
    for t, h, w in grid_thw.tolist():
        length = h * w
        lengths.extend([length] * t)
        if runs and runs[-1][2] == length and runs[-1][0] + runs[-1][1] * length == start:
            first, frames, _ = runs[-1]
            runs[-1] = (first, frames + t, length)
        else:
            runs.append((start, t, length))
        start += t * length
    cu_seqlens = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu_seqlens[1:] = torch.tensor(lengths, dtype=torch.int32).cumsum(0)
    return FrameRuns(runs, cu_seqlens.to(grid_thw.device), max(lengths, default=0))


def attend_runs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, frames: FrameRuns, scale: float) -> torch.Tensor:
    """[N, A, D] packed q/k/v -> [N, A, D]: full attention within each frame, one SDPA call per
    run of equal-length frames ([frames, A, length, D] batched)."""

    def attend(start: int, count: int, length: int) -> torch.Tensor:
        end = start + count * length

        def heads_first(x: torch.Tensor) -> torch.Tensor:
            # torch's CPU attention kernel reads each head's [L, D] rows fastest when they lie one
            # after the other (4% on a page frame, docs/benchmarks-log.md): true already for q/k/v
            # laid out head-major by `rotated_qkv`, else one copy.
            y = x[start:end].view(count, length, *x.shape[1:]).transpose(1, 2)  # [F, A, L, D]
            return y if y.stride(-2) == y.shape[-1] and y.stride(-1) == 1 else y.contiguous()

        attended = scaled_dot_product_attention(heads_first(q), heads_first(k), heads_first(v), scale=scale)
        return attended.transpose(1, 2).reshape(end - start, *q.shape[1:])  # [F x L, A, D]

    if len(frames.runs) == 1:  # one page, or same-size photos: no second copy into `out`
        return attend(*frames.runs[0])
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    for start, count, length in frames.runs:
        out[start:start + count * length] = attend(start, count, length)
    return out


def attend_flash_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, frames: FrameRuns, scale: float) -> torch.Tensor:
    """The same attention as `attend_runs` as one flash-attn variable-length call (CUDA, 16-bit)."""
    from flash_attn import flash_attn_varlen_func

    cu = frames.cu_seqlens.to(q.device)
    return flash_attn_varlen_func(q, k, v, cu, cu, frames.longest, frames.longest, softmax_scale=scale, causal=False)


def tower_kernel(mode: str, device: torch.device, dtype: torch.dtype):
    """The attention function for `mode`: "flash-attn" where asked (or, for "auto", where CUDA,
    a 16-bit dtype and an installed flash-attn allow), else batched SDPA (`attend_runs`)."""
    flash_ok = device.type == "cuda" and dtype in (torch.float16, torch.bfloat16) and importlib.util.find_spec("flash_attn")
    if mode == "flash-attn" or (mode == "auto" and flash_ok):
        return attend_flash_varlen
    return attend_runs


def rotated_qkv(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype,
                heads_first: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[N, 3, A, D] qkv -> q, k, v [N, A, D] each in `dtype`, q and k rotated by 2-D RoPE in
    float32 as transformers' `apply_rotary_pos_emb_vision` rotates (q*cos + rotate_half(q)*sin,
    written per half: x1*cos - x2*sin | x2*cos + x1*sin, the same products and sums). cos/sin
    [N, 1, 1, D] float32.

    In 4 passes over q and k instead of 9 (upcast, two products, negation, concatenation, sum,
    downcast, head-major copy): one upcast, then each half's float32 sum is written once, straight into the
    output; with `heads_first` the output's storage is [3, A, N, D], the layout torch's CPU
    attention kernel reads fastest, so `attend_runs` needs no copy of its own."""
    n, _, heads, width = qkv.shape
    half = width // 2
    if heads_first:
        out = torch.empty(3, heads, n, width, dtype=dtype, device=qkv.device).permute(2, 0, 1, 3)  # [N, 3, A, D] view
    else:
        out = torch.empty(n, 3, heads, width, dtype=dtype, device=qkv.device)
    qk = qkv[:, :2].to(cos.dtype)  # [N, 2, A, D] float32: one upcast (mixed-dtype products would cast per op)
    x1, x2 = qk[..., :half], qk[..., half:]  # [N, 2, A, D/2] each
    cos1, cos2, sin1, sin2 = cos[..., :half], cos[..., half:], sin[..., :half], sin[..., half:]
    out[:, :2, :, :half] = (x1 * cos1).addcmul_(x2, sin1, value=-1)  # float32 sums, rounded once
    out[:, :2, :, half:] = (x2 * cos2).addcmul_(x1, sin2)
    out[:, 2] = qkv[:, 2]
    return out.unbind(1)


def embed_patches(patch_embed, pixel_values: torch.Tensor) -> torch.Tensor:
    """[N, C x T_p x P x P] patches -> [N, d]: the checkpoint's `patch_embed.proj` (a Conv3d whose
    stride equals its kernel, so each output is one dot product of a whole patch with a filter)
    as the one matrix product it is. torch's CPU Conv3d takes 5x (float32) to 70x (bfloat16 on an
    AMX Xeon) a linear layer's time for it: 6.7 s against 0.09 s on a page's 7,200 patches,
    more than the tower's two blocks together. Same sums; the order of their terms may differ."""
    proj = patch_embed.proj
    weight = proj.weight.view(proj.out_channels, -1)  # [d, C x T_p x P x P], the order of a patch's values
    return torch.nn.functional.linear(pixel_values.to(weight.dtype), weight, proj.bias)


def position_embeddings(pos_embed: torch.nn.Embedding, indices: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """[N, taps] grid indices and float32 bilinear weights -> [N, d] float32: each patch's learned
    position as the weighted sum of its taps, as transformers sums it ((pos_embed(indices) *
    weights).sum(1), float32) but in one `embedding_bag` call over the small table in float32
    instead of a [N, taps, d] gather, its float32 upcast and a product (3 copies of 4 rows per patch)."""
    table = pos_embed.weight.float()  # [grid^2, d]: small
    return torch.nn.functional.embedding_bag(indices, table, per_sample_weights=weights.to(table.dtype), mode="sum")


def gelu_algorithm(act_fn) -> str | None:
    """oneDNN's name for a GELU module's formula ("tanh" or "none", as torch's `approximate`),
    or None for any other activation (which then runs after its linear layer)."""
    from transformers.activations import GELUActivation, GELUTanh

    if isinstance(act_fn, torch.nn.GELU):
        return act_fn.approximate
    if isinstance(act_fn, GELUTanh):
        return "tanh"
    if isinstance(act_fn, GELUActivation) and getattr(act_fn, "act", None) is torch.nn.functional.gelu:
        return "none"
    return None


def linear_gelu(linear: torch.nn.Linear, act_fn, x: torch.Tensor, fused: bool) -> torch.Tensor:
    """act_fn(linear(x)); `fused`: as one oneDNN matmul with the GELU applied to its float32
    accumulator before the output is rounded (no second pass over the [N, 4d] activations)."""
    if fused:
        return torch.ops.mkldnn._linear_pointwise(x, linear.weight, linear.bias, "gelu", [], gelu_algorithm(act_fn))
    return act_fn(linear(x))


def can_fuse_gelu(linear, act_fn, x: torch.Tensor) -> bool:
    """Whether `linear_gelu(..., fused=True)` can run: a plain float32/bfloat16 linear layer (not
    int8) on a CPU with oneDNN, and a GELU activation."""
    return (type(linear) is torch.nn.Linear and x.device.type == "cpu" and torch.backends.mkldnn.is_available()
            and x.dtype in (torch.float32, torch.bfloat16) and linear.weight.dtype == x.dtype
            and gelu_algorithm(act_fn) is not None)


class PackedVisionTower:
    """`visual` (a transformers Qwen3VLVisionModel) run over a batch's packed patches.

    Example: `PackedVisionTower(model.visual)(pixel_values, grid_thw)` -> `VisionFeatures`, equal
    (fp32, < 1e-5) to `model.visual(pixel_values, grid_thw)`'s pooler_output / deepstack_features.
    """

    def __init__(self, visual, attention: str = "auto", attention_dtype: str | None = None,
                 trials: KernelTrials | None = None, gelu: str | None = None,
                 gelu_trials: KernelTrials | None = None) -> None:
        """attention_dtype: on a CPU with a 16-bit tower, "auto" (default: $FASTE_MM_TOWER_ATTENTION_DTYPE,
        else "auto") attends in whichever of float32 and the model's dtype a trial measures faster
        (`kernel_choice`); "float32" or "bfloat16" forces it. gelu: on a CPU, "auto" (default:
        $FASTE_MM_TOWER_GELU, else "auto") runs each MLP's first linear layer and its GELU as one
        oneDNN call or as two, whichever a trial measures faster; "fused" or "separate" forces it.
        `trials` and `gelu_trials` are injectable for tests."""
        from transformers.vision_utils import get_vision_interpolation_indices_and_weights, get_vision_position_ids

        self.visual = visual
        self._interpolation = get_vision_interpolation_indices_and_weights
        self._position_ids = get_vision_position_ids
        weight = visual.patch_embed.proj.weight
        self.attend = tower_kernel(attention, weight.device, weight.dtype)
        self.heads_first = self.attend is attend_runs  # SDPA reads head-major q/k/v; flash-attn packed rows
        self.deepstack_levels = {layer: level for level, layer in enumerate(visual.deepstack_visual_indexes)}
        cache = TrialCache(machine_key(read_cpu_flags()))
        self.trials = trials or KernelTrials("tower attention", requested_attention_dtype(attention_dtype), cache)
        self.gelu_trials = gelu_trials or KernelTrials("tower linear+GELU", requested_gelu(gelu), cache,
                                                       variable=TOWER_GELU_ENV)
        self.trials.related.append(self.gelu_trials)  # both verdicts in `bench`/`embed`'s lines

    def __call__(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> VisionFeatures:
        """pixel_values [N, C x T_p x P x P] patches of every image/video in order, grid_thw [n, 3]."""
        visual = self.visual
        merge = visual.spatial_merge_size
        indices, weights = self._interpolation(
            grid_thw, num_grid_per_side=visual.num_grid_per_side, mode=visual.interpolation_mode,
            align_corners=visual.interpolation_align_corners, spatial_merge_size=merge,
        )  # [N, taps] each
        hidden = embed_patches(visual.patch_embed, pixel_values)  # [N, d]
        hidden = hidden + position_embeddings(visual.pos_embed, indices, weights).to(hidden.dtype)
        cos, sin = visual.rotary_pos_emb(hidden, self._position_ids(grid_thw, merge))  # [N, D] float32 each
        cos, sin = cos[:, None, None, :], sin[:, None, None, :]  # broadcast over q/k and heads
        frames = frame_runs(grid_thw)
        bucket = self._bucket(frames, hidden)
        deepstack: list[torch.Tensor] = []
        for index, block in enumerate(visual.blocks):
            hidden = hidden + self._attention(block.attn, block.norm1(hidden), cos, sin, frames, bucket)
            mlp = block.mlp
            hidden = hidden + mlp.linear_fc2(self._linear_gelu(mlp.linear_fc1, mlp.act_fn, block.norm2(hidden)))
            if index in self.deepstack_levels:
                deepstack.append(self._merge(visual.deepstack_merger_list[self.deepstack_levels[index]], hidden))
        sizes = (grid_thw.prod(-1) // merge**2).tolist()
        return VisionFeatures(self._merge(visual.merger, hidden), tuple(deepstack), sizes)

    def _merge(self, merger, hidden: torch.Tensor) -> torch.Tensor:
        """A patch merger (transformers' `Qwen3VLVisionPatchMerger.forward`, spelled out so its
        GELU can run inside its first linear layer): [N, d] -> [N / merge, H_out]."""
        width = merger.hidden_size  # d x merge
        x = merger.norm(hidden.view(-1, width) if merger.use_postshuffle_norm else hidden).view(-1, width)
        return merger.linear_fc2(self._linear_gelu(merger.linear_fc1, merger.act_fn, x))

    def _linear_gelu(self, linear, act_fn, x: torch.Tensor) -> torch.Tensor:
        """act_fn(linear(x)), fused into oneDNN's matmul or not as settled per shape by trial."""
        if not can_fuse_gelu(linear, act_fn, x):
            return act_fn(linear(x))
        rows = 1 << max(x.shape[0] - 1, 0).bit_length()
        bucket = (f"cpu {str(x.dtype).removeprefix('torch.')} linear {linear.in_features}->{linear.out_features} "
                  f"gelu({gelu_algorithm(act_fn)}) rows<={rows}")
        return self.gelu_trials.run(bucket, lambda name: lambda: linear_gelu(linear, act_fn, x, name == "fused"),
                                    ("fused", "separate"))

    def _bucket(self, frames: FrameRuns, hidden: torch.Tensor) -> str | None:
        """The shape bucket whose attention dtype is settled by trial, or None where no trial
        applies: CUDA attends in the model's dtype (its kernels are made for it), and a float32
        tower has nothing to choose. Frames are bucketed by the power of two above the longest."""
        if hidden.device.type != "cpu" or hidden.dtype == torch.float32:
            return None
        heads = self.visual.blocks[0].attn.num_heads
        longest = 1 << max(frames.longest - 1, 0).bit_length()
        return f"cpu {str(hidden.dtype).removeprefix('torch.')} {heads}x{hidden.shape[-1] // heads} frames<={longest}"

    def _attention(self, attention, x: torch.Tensor, cos, sin, frames: FrameRuns, bucket: str | None) -> torch.Tensor:
        """The block's attention: qkv, 2-D RoPE in float32 (as transformers rotates), per-frame
        attention in the settled dtype, output projection."""
        n = x.shape[0]
        qkv = attention.qkv(x).view(n, 3, attention.num_heads, -1)  # [N, 3, A, D]

        def attend(dtype: torch.dtype) -> torch.Tensor:
            q, k, v = rotated_qkv(qkv, cos, sin, dtype, self.heads_first)  # [N, A, D] each
            return self.attend(q, k, v, frames, attention.scaling)  # [N, A, D]

        if bucket is None:
            attended = attend(x.dtype)
        elif (settled := self.trials.settled(bucket)) is not None:
            attended = attend(getattr(torch, settled.choice))
        else:
            # A CPU's attention kernel may be faster in float32 (no native 16-bit: up to 4.5x on a
            # page without AMX) or in the model's dtype (AMX: 2-5x): measured on this first call
            # (the winner's output is used), then settled for the bucket.
            names = {"float32": torch.float32, str(x.dtype).removeprefix("torch."): x.dtype}
            _, attended = self.trials.trial(bucket, {name: (lambda d=dtype: attend(d)) for name, dtype in names.items()})
        return attention.proj(attended.reshape(n, -1).to(x.dtype))

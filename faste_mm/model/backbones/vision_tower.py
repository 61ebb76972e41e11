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

from faste_mm.model.backbones.machine import read_cpu_flags
from faste_mm.model.kernel_choice import KernelTrials, TrialCache, machine_key, requested_attention_dtype

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
            # One head-major copy: torch's CPU attention kernel reads contiguous [F, A, L, D] rows
            # faster than the strided views of the packed qkv, by more than the copy costs (4% on a
            # page frame, docs/benchmarks-log.md).
            return x[start:end].view(count, length, *x.shape[1:]).transpose(1, 2).contiguous()  # [F, A, L, D]

        attended = scaled_dot_product_attention(heads_first(q), heads_first(k), heads_first(v), scale=scale)
        return attended.transpose(1, 2).reshape(end - start, *q.shape[1:])  # [F x L, A, D]

    if len(frames.runs) == 1:  # one page, or same-size photos: no second copy into `out`
        return attend(*frames.runs[0])
    out = torch.empty_like(q)
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


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotate_qk(qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """[N, 2, A, D] queries and keys -> the same rotated by 2-D RoPE, in float32 as transformers'
    `apply_rotary_pos_emb_vision` rotates (element for element the same arithmetic), but q and k
    together: one float32 copy instead of three each. Returned in float32: the caller casts (or,
    on a CPU, attends in float32)."""
    x = qk.float()  # no copy when the tower runs float32
    return x * cos + rotate_half(x) * sin


class PackedVisionTower:
    """`visual` (a transformers Qwen3VLVisionModel) run over a batch's packed patches.

    Example: `PackedVisionTower(model.visual)(pixel_values, grid_thw)` -> `VisionFeatures`, equal
    (fp32, < 1e-5) to `model.visual(pixel_values, grid_thw)`'s pooler_output / deepstack_features.
    """

    def __init__(self, visual, attention: str = "auto", attention_dtype: str | None = None,
                 trials: KernelTrials | None = None) -> None:
        """attention_dtype: on a CPU with a 16-bit tower, "auto" (default: $FASTE_MM_TOWER_ATTENTION_DTYPE,
        else "auto") attends in whichever of float32 and the model's dtype a trial measures faster
        (`kernel_choice`); "float32" or "bfloat16" forces it. `trials` is injectable for tests."""
        from transformers.vision_utils import get_vision_interpolation_indices_and_weights, get_vision_position_ids

        self.visual = visual
        self._interpolation = get_vision_interpolation_indices_and_weights
        self._position_ids = get_vision_position_ids
        weight = visual.patch_embed.proj.weight
        self.attend = tower_kernel(attention, weight.device, weight.dtype)
        self.deepstack_levels = {layer: level for level, layer in enumerate(visual.deepstack_visual_indexes)}
        requested = requested_attention_dtype(attention_dtype)
        self.trials = trials or KernelTrials("tower attention", requested,
                                             TrialCache(machine_key(read_cpu_flags())))

    def __call__(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> VisionFeatures:
        """pixel_values [N, C x T_p x P x P] patches of every image/video in order, grid_thw [n, 3]."""
        visual = self.visual
        merge = visual.spatial_merge_size
        indices, weights = self._interpolation(
            grid_thw, num_grid_per_side=visual.num_grid_per_side, mode=visual.interpolation_mode,
            align_corners=visual.interpolation_align_corners, spatial_merge_size=merge,
        )  # [N, taps] each
        hidden = visual.patch_embed(pixel_values)  # [N, d]
        hidden = hidden + (visual.pos_embed(indices) * weights[:, :, None]).sum(1).to(hidden.dtype)
        cos, sin = visual.rotary_pos_emb(hidden, self._position_ids(grid_thw, merge))  # [N, D] float32 each
        cos, sin = cos[:, None, None, :], sin[:, None, None, :]  # broadcast over q/k and heads
        frames = frame_runs(grid_thw)
        bucket = self._bucket(frames, hidden)
        deepstack: list[torch.Tensor] = []
        for index, block in enumerate(visual.blocks):
            hidden = hidden + self._attention(block.attn, block.norm1(hidden), cos, sin, frames, bucket)
            hidden = hidden + block.mlp(block.norm2(hidden))
            if index in self.deepstack_levels:
                deepstack.append(visual.deepstack_merger_list[self.deepstack_levels[index]](hidden))
        sizes = (grid_thw.prod(-1) // merge**2).tolist()
        return VisionFeatures(visual.merger(hidden), tuple(deepstack), sizes)

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
        qk = rotate_qk(qkv[:, :2], cos, sin)  # [N, 2, A, D] float32

        def attend(dtype: torch.dtype) -> torch.Tensor:
            q, k = qk.to(dtype).unbind(1)  # [N, A, D] each
            return self.attend(q, k, qkv[:, 2].to(dtype), frames, attention.scaling)  # [N, A, D]

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

"""The vision tower's CPU kernel paths (model/backbones/vision_tower.py) against their references:
the patch embedding as a matrix product vs the checkpoint's Conv3d, the position embedding's
`embedding_bag` vs transformers' gather-and-sum, RoPE written per half (head-major) vs
transformers' `apply_rotary_pos_emb_vision`, the GELU fused into oneDNN's linear call vs the
linear layer then the GELU; and the whole tower with the GELU forced either way vs transformers'."""

from __future__ import annotations

import pytest
import torch

from faste_mm.model.backbones.vision_tower import (PackedVisionTower, embed_patches, gelu_algorithm, linear_gelu,
                                                   position_embeddings, rotated_qkv)
from faste_mm.model.cpu.kernel_choice import TOWER_GELU_ENV, KernelTrials, requested_gelu


@pytest.fixture(scope="module")
def visual(model_dirs):
    from transformers import Qwen3VLModel

    return Qwen3VLModel.from_pretrained(str(model_dirs["qwen3_vl"]), dtype=torch.float32).eval().visual


def test_patch_embedding_as_a_matrix_product_equals_the_conv3d(visual):
    config = visual.config
    torch.manual_seed(0)
    pixels = torch.randn(37, config.in_channels * config.temporal_patch_size * config.patch_size**2)
    with torch.inference_mode():
        torch.testing.assert_close(embed_patches(visual.patch_embed, pixels), visual.patch_embed(pixels), atol=1e-5, rtol=0)


def test_position_embedding_bag_equals_the_gather_and_weighted_sum(visual):
    from transformers.vision_utils import get_vision_interpolation_indices_and_weights

    grids = torch.tensor([[1, 8, 6], [2, 4, 4]])
    indices, weights = get_vision_interpolation_indices_and_weights(
        grids, num_grid_per_side=visual.num_grid_per_side, mode=visual.interpolation_mode,
        align_corners=visual.interpolation_align_corners, spatial_merge_size=visual.spatial_merge_size)
    table = visual.pos_embed.to(torch.bfloat16)
    with torch.inference_mode():
        expected = (table(indices) * weights[:, :, None]).sum(1)  # float32, as transformers sums it
        got = position_embeddings(table, indices, weights)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads_first", [True, False])
def test_rope_per_half_equals_transformers_rotation(dtype, heads_first):
    from transformers.models.qwen3_vl.modeling_qwen3_vl import apply_rotary_pos_emb_vision

    n, heads, width = 50, 4, 16
    torch.manual_seed(0)
    qkv = torch.randn(n, 3, heads, width).to(dtype)
    angles = torch.rand(n, width // 2) * 6
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)  # [N, D] float32
    q_ref, k_ref = apply_rotary_pos_emb_vision(qkv[:, 0], qkv[:, 1], cos, sin)  # rotated in float32, cast back
    q, k, v = rotated_qkv(qkv, cos[:, None, None], sin[:, None, None], dtype, heads_first)
    # float32: the same products and sums; bfloat16: at most one rounding step apart
    atol = 1e-6 if dtype == torch.float32 else 2 ** -7 * float(q_ref.abs().max())
    torch.testing.assert_close(q, q_ref, atol=atol, rtol=0)
    torch.testing.assert_close(k, k_ref, atol=atol, rtol=0)
    assert torch.equal(v, qkv[:, 2])
    if heads_first:  # each head's rows one after the other: what torch's CPU attention reads without a copy
        assert q.transpose(0, 1).is_contiguous()


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="the fused path is oneDNN's")
@pytest.mark.parametrize("act", [torch.nn.GELU(approximate="tanh"), torch.nn.GELU()], ids=["tanh", "exact"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_linear_gelu_equals_linear_then_gelu(act, dtype):
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 96).to(dtype)
    x = torch.randn(33, 64).to(dtype)
    with torch.inference_mode():
        fused, separate = linear_gelu(linear, act, x, fused=True), linear_gelu(linear, act, x, fused=False)
        reference = act(torch.nn.functional.linear(x.double(), linear.weight.double(), linear.bias.double()))
    assert fused.dtype == dtype
    # fused rounds once (the GELU of the float32 accumulator), separate twice: both near float64's
    tolerance = 1e-5 if dtype == torch.float32 else 2 ** -7 * float(reference.abs().max())
    for got in (fused, separate):
        torch.testing.assert_close(got.double(), reference, atol=tolerance, rtol=0)


def test_gelu_algorithm_names_only_gelus():
    from transformers.activations import ACT2FN

    assert gelu_algorithm(ACT2FN["gelu_pytorch_tanh"]) == "tanh"
    assert gelu_algorithm(ACT2FN["gelu"]) == "none"
    assert gelu_algorithm(torch.nn.GELU()) == "none"
    assert gelu_algorithm(ACT2FN["silu"]) is None


@pytest.mark.parametrize("gelu", ["fused", "separate"])
def test_tower_with_gelu_either_way_is_within_bf16_tolerance_of_transformers(model_dirs, gelu):
    from transformers import Qwen3VLModel

    visual = Qwen3VLModel.from_pretrained(str(model_dirs["qwen3_vl"]), dtype=torch.bfloat16).eval().visual
    config = visual.config
    grids = torch.tensor([[1, 4, 6], [1, 4, 6], [1, 8, 4]])
    torch.manual_seed(1)
    pixels = torch.randn(int(grids.prod(-1).sum()), config.in_channels * config.temporal_patch_size * config.patch_size**2).bfloat16()
    trials = KernelTrials("tower linear+GELU", requested_gelu(gelu), None, variable=TOWER_GELU_ENV)
    with torch.inference_mode():
        expected = visual(pixels, grid_thw=grids, return_dict=True).pooler_output.float()
        got = PackedVisionTower(visual, attention="sdpa", gelu_trials=trials)(pixels, grids).merged.float()
    assert {choice.choice for choice in trials.choices.values()} == {gelu}
    assert all(TOWER_GELU_ENV in line for line in trials.describe())
    cosine = torch.nn.functional.cosine_similarity(got, expected, dim=-1)
    assert cosine.min() > 0.999, cosine.min()
    torch.testing.assert_close(got, expected, atol=0.05 * float(expected.abs().max()), rtol=0)

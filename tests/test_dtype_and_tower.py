"""dtype "auto" per CPU capability (the capability injected), FastE's controller deciding in float32
on a bfloat16 model (against a naive float64 reference on the same bf16 hidden states), bf16
vectors near fp32 ones, and the packed vision tower equal to transformers' Qwen3VLVisionModel."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from faste_mm import BatchingConfig, Embedder
from faste_mm.errors import ConfigError
from faste_mm.model.backbones.loading import choose_dtype, read_cpu_flags
from faste_mm.model.backbones.vision_tower import PackedVisionTower, frame_runs
from faste_mm.model.batching import collate
from faste_mm.model.faste import ThresholdTrigger, batch_alignment, plan_keep, prefix_budgets, readout_attention
from faste_mm.model.items import as_item

CPU = torch.device("cpu")


def flags(*names: str):
    return lambda: frozenset(names)


@pytest.mark.parametrize("flag", ["avx512_bf16", "amx_bf16", "bf16"])
def test_auto_dtype_is_bfloat16_on_a_cpu_with_native_bf16(flag):
    choice = choose_dtype("auto", CPU, torch.bfloat16, cpu_flags=flags("avx2", flag))
    assert choice.dtype == torch.bfloat16
    assert flag in choice.reason and choice.describe().startswith("bfloat16: ")


def test_auto_dtype_is_float32_on_a_cpu_without_bf16_or_for_a_float32_checkpoint():
    plain = choose_dtype("auto", CPU, torch.bfloat16, cpu_flags=flags("avx2", "fma", "avx512f"))
    assert plain.dtype == torch.float32 and "no native bfloat16" in plain.reason
    stored32 = choose_dtype("auto", CPU, torch.float32, cpu_flags=flags("avx512_bf16"))
    assert stored32.dtype == torch.float32 and "checkpoint is stored in float32" in stored32.reason


def test_explicit_dtype_wins_over_the_cpu_and_unknown_names_are_refused():
    assert choose_dtype("float32", CPU, torch.bfloat16, cpu_flags=flags("avx512_bf16")).dtype == torch.float32
    assert choose_dtype("auto", torch.device("cuda"), torch.float32, cpu_flags=flags()).dtype == torch.bfloat16
    with pytest.raises(ConfigError, match="'fp8'.*|.*fp8"):
        choose_dtype("fp8", CPU)


def test_cpu_flags_are_read_from_x86_and_arm_cpuinfo(tmp_path, monkeypatch):
    monkeypatch.setattr("sys.platform", "linux")
    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512_bf16 amx_tile\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd bf16 i8mm\n")
    assert {"avx512_bf16", "amx_tile"} <= read_cpu_flags(x86)
    assert "bf16" in read_cpu_flags(arm)
    assert read_cpu_flags(tmp_path / "missing") == frozenset()


def test_a_float32_checkpoint_loads_as_float32_and_stats_say_why(vl_embedder):
    choice = vl_embedder.dtype_choice
    assert choice.dtype == torch.float32 == vl_embedder.backbone.dtype
    stats = vl_embedder.encode(["a red bicycle"]).stats
    assert stats.dtype == choice.to_dict() and stats.dtype["reason"]


@pytest.fixture(scope="module")
def bf16_embedder(model_dirs) -> Embedder:
    return Embedder.from_pretrained(str(model_dirs["qwen3_vl"]), device="cpu", dtype="bfloat16",
                                    batching=BatchingConfig(batch_tokens=1 << 20))


def _reference_alignment(state) -> float:
    """g averaged over rows, in float64, one row at a time (docs/design.md, Algorithm 1 lines 5-6)."""
    values = []
    for b in range(state.hidden.shape[0]):
        hidden = state.hidden[b].double()
        prefix = hidden[state.prefix_mask[b]]
        readout = hidden[int(state.readout_index[b])]
        values.append(torch.nn.functional.cosine_similarity(readout, prefix.mean(0), dim=0).item())
    return float(np.mean(values))


def _reference_keep(backbone, layer: int, state, budgets) -> list[list[int]]:
    """Top-R_i prefix slots by readout attention, per row, in float64 after the layer's own
    (model-dtype) projections: q/k norm, RoPE, logits, softmax over the prefix, head mean."""
    attention = backbone.layers[layer].self_attn
    normed = backbone.layers[layer].input_layernorm(state.hidden)
    d_h = backbone.shape.head_dim
    kept = []
    for b in range(normed.shape[0]):
        def heads(proj, norm):
            x = getattr(attention, norm)(getattr(attention, proj)(normed[b]).view(normed.shape[1], -1, d_h)).double()
            cos, sin = state.cos[b].double()[:, None], state.sin[b].double()[:, None]
            half = d_h // 2
            return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin  # [T, heads, D_h]
        q, k = heads("q_proj", "q_norm"), heads("k_proj", "k_norm")
        readout = int(state.readout_index[b])
        group = q.shape[1] // k.shape[1]
        logits = torch.einsum("ad,atd->at", q[readout], k.repeat_interleave(group, 1).transpose(0, 1))
        logits = logits * backbone.attention_scale(layer)
        logits[:, ~state.prefix_mask[b]] = float("-inf")
        scores = logits.softmax(-1).mean(0)
        kept.append(sorted(scores.topk(int(budgets[b])).indices.tolist()))
    return kept


def test_bf16_controller_decides_as_a_float64_reference_on_the_same_bf16_states(bf16_embedder, mixed_items):
    backbone = bf16_embedder.backbone
    assert backbone.dtype == torch.bfloat16
    serialized = [backbone.with_positions(bf16_embedder.serializer(as_item(x, i), None)) for i, x in enumerate(mixed_items)]
    batch = collate(serialized, list(range(len(serialized))), bf16_embedder.loaded.pad_token_id)
    ours, reference = [], []
    with torch.inference_mode():
        state = backbone.embed(batch)
        masks = backbone.attention_masks(state)
        budgets = prefix_budgets(state.lengths - 1, 0.5)
        for layer in range(len(backbone.layers)):
            ours.append(float(batch_alignment(state)))
            reference.append(_reference_alignment(state))
            plan = plan_keep(readout_attention(backbone, layer, state), budgets, state)
            got = [sorted(plan.index[b, : int(budgets[b])].tolist()) for b in range(len(budgets))]
            assert got == _reference_keep(backbone, layer, state, budgets), f"kept set differs before layer {layer}"
            state = backbone.after_layer(layer, state.with_hidden(backbone.run_layer(layer, state, masks)))
    np.testing.assert_allclose(ours, reference, atol=2e-6)  # bf16 sums would be off by ~1e-3
    # thresholds half-way between measured alignments: the trigger layer is the reference's
    points = sorted(reference)
    for theta in [(a + b) / 2 for a, b in zip(points, points[1:])]:
        trigger = ThresholdTrigger(theta, 1, len(backbone.layers))
        assert trigger.first_layer(ours) == trigger.first_layer(reference)


def test_bf16_vectors_are_within_a_stated_tolerance_of_fp32(vl_embedder, bf16_embedder, mixed_items):
    """bfloat16 keeps 8 mantissa bits: on the tiny random model every vector keeps cosine >= 0.99
    to its float32 twin (the full forward and FastE r=0.5)."""
    from faste_mm import FastEConfig

    for fast_e in (None, FastEConfig(r_max=0.5)):
        fp32 = vl_embedder.encode(mixed_items, fast_e=fast_e).embeddings
        bf16 = bf16_embedder.encode(mixed_items, fast_e=fast_e).embeddings
        assert bf16.dtype == np.float32
        np.testing.assert_allclose(np.linalg.norm(bf16, axis=1), 1.0, atol=1e-5)  # normalised in float32
        assert (fp32 * bf16).sum(axis=1).min() >= 0.99


def test_frames_of_equal_length_next_to_each_other_share_one_attention_run():
    grids = torch.tensor([[1, 4, 6], [1, 4, 6], [1, 8, 4], [3, 4, 4], [1, 2, 2]])
    frames = frame_runs(grids)
    assert frames.runs == [(0, 2, 24), (48, 1, 32), (80, 3, 16), (128, 1, 4)]
    from transformers.vision_utils import get_vision_cu_seqlens

    assert frames.cu_seqlens.tolist() == get_vision_cu_seqlens(grids).tolist() and frames.longest == 32


def test_packed_tower_equals_transformers_vision_model(model_dirs):
    """Images of different sizes (two alike, packed into one run) and a 3-frame-pair video in one
    packed call == transformers' Qwen3VLVisionModel, fp32, < 1e-5."""
    from transformers import Qwen3VLModel

    visual = Qwen3VLModel.from_pretrained(str(model_dirs["qwen3_vl"])).eval().visual
    config = visual.config
    grids = torch.tensor([[1, 4, 6], [1, 4, 6], [1, 8, 4], [3, 4, 4], [1, 2, 2]])
    torch.manual_seed(0)
    pixels = torch.randn(int(grids.prod(-1).sum()), config.in_channels * config.temporal_patch_size * config.patch_size**2)
    with torch.inference_mode():
        expected = visual(pixels, grid_thw=grids, return_dict=True)
        got = PackedVisionTower(visual, attention="sdpa")(pixels, grids)
    assert got.sizes == (grids.prod(-1) // config.spatial_merge_size**2).tolist()
    torch.testing.assert_close(got.merged, expected.pooler_output, atol=1e-5, rtol=0)
    assert len(got.deepstack) == len(expected.deepstack_features) > 0
    for ours, theirs in zip(got.deepstack, expected.deepstack_features):
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)


@pytest.mark.parametrize("grids", [[[1, 4, 6], [1, 4, 6], [1, 8, 4], [3, 4, 4]], [[1, 8, 6]]], ids=["runs", "one page"])
def test_packed_tower_in_bfloat16_matches_transformers_bfloat16_tower(model_dirs, grids):
    """The bfloat16 tower (q and k rotated together in float32; one run returned without a copy
    into a buffer) gives transformers' bfloat16 tower's features within bfloat16 rounding."""
    from transformers import Qwen3VLModel

    visual = Qwen3VLModel.from_pretrained(str(model_dirs["qwen3_vl"]), dtype=torch.bfloat16).eval().visual
    config = visual.config
    grids = torch.tensor(grids)
    torch.manual_seed(1)
    pixels = torch.randn(int(grids.prod(-1).sum()), config.in_channels * config.temporal_patch_size * config.patch_size**2)
    with torch.inference_mode():
        expected = visual(pixels.bfloat16(), grid_thw=grids, return_dict=True).pooler_output.float()
        got = PackedVisionTower(visual, attention="sdpa")(pixels.bfloat16(), grids).merged.float()
    assert got.shape == expected.shape
    cosine = torch.nn.functional.cosine_similarity(got, expected, dim=-1)
    assert cosine.min() > 0.999, cosine.min()
    torch.testing.assert_close(got, expected, atol=0.05 * float(expected.abs().max()), rtol=0)


def test_stats_split_the_forward_into_tower_and_decoder_seconds(vl_embedder, image_dir):
    from faste_mm import Item

    images = vl_embedder.encode([Item(image=image_dir / "red.png"), Item(image=image_dir / "gray.jpg")]).stats
    texts = vl_embedder.encode(["a red bicycle", "a wall"]).stats
    assert images.tower_s > 0 and images.decoder_s > 0 and images.tower_s + images.decoder_s <= images.forward_s
    assert texts.tower_s == 0 and texts.tower_share == 0 and texts.decoder_s > 0
    assert sum(t.tower_s for t in images.batches) == images.tower_s
    assert images.tower_flops_share == images.flops_vision / (images.flops_vision + images.flops_realised) > 0
    assert images.to_dict()["tower_time_share"] == images.tower_s / (images.tower_s + images.decoder_s)

"""FLOPs accounting (docs/design.md's formulas) against hand-worked numbers and against the realised runs."""

from __future__ import annotations

from PIL import Image
from torch.utils.flop_counter import FlopCounterMode

from faste_mm import FastEConfig, Item
from faste_mm.model.batching import collate
from faste_mm.model.flops import DecoderShape, batch_flops, flops_reduction, full_batch_flops, layer_flops, vision_flops

QWEN3_VL_2B = DecoderShape(num_layers=28, hidden=2048, intermediate=6144, heads=16, kv_heads=8, head_dim=128)


def test_layer_flops_match_the_design_formula_worked_by_hand():
    # T = 10, P = 100, Q = 16*128 = 2048, K = 8*128 = 1024:
    # proj = 2*10*[2048*(2048 + 2*1024) + 2048*2048] = 20 * 12,582,912 = 251,658,240
    # attn = 4*100*16*128 = 819,200 ; mlp = 6*10*2048*6144 = 754,974,720
    assert layer_flops(QWEN3_VL_2B, tokens=10, pairs=100) == 251_658_240 + 819_200 + 754_974_720


def test_batch_flops_sum_layers_over_realised_padded_lengths():
    realised = batch_flops(QWEN3_VL_2B, 4, [100] * 10 + [51] * 18)
    full = full_batch_flops(QWEN3_VL_2B, 4, 100)
    assert realised == 10 * layer_flops(QWEN3_VL_2B, 400, 40_000) + 18 * layer_flops(QWEN3_VL_2B, 204, 10_404)
    assert full == 28 * layer_flops(QWEN3_VL_2B, 400, 40_000)
    assert 0.0 < flops_reduction(realised, full) < 18 / 28 * 0.5 + 0.05


def test_encode_stats_compare_the_same_batches_with_and_without_compression(vl_embedder, mixed_items):
    full = vl_embedder.encode(mixed_items).stats
    fast = vl_embedder.encode(mixed_items, fast_e=FastEConfig(r_max=0.5, trigger_layer=3)).stats
    assert full.flops_realised == full.flops_full == fast.flops_full
    assert full.flops_reduction == 0.0 and full.prefix_removal == 0.0
    trace = fast.batches[0]
    shape = vl_embedder.backbone.shape
    assert trace.padded_lengths[:3] == [trace.padded_lengths[0]] * 3
    assert trace.padded_lengths[3] < trace.padded_lengths[0]
    assert fast.flops_realised == batch_flops(shape, trace.batch_size, trace.padded_lengths)
    assert fast.flops_reduction == 1 - fast.flops_realised / fast.flops_full
    assert abs(fast.prefix_removal - 0.5) < 0.05
    assert fast.mean_trigger_layer == 3
    assert fast.to_dict()["fast_e"]["trigger_layer"] == 3


def test_vision_flops_equal_torch_flop_counter_on_the_real_vision_tower(model_dirs, vl_embedder):
    from transformers import Qwen3VLModel

    # eager attention: its matmuls are visible to the counter (fused SDPA on CPU is not counted)
    model = Qwen3VLModel.from_pretrained(str(model_dirs["qwen3_vl"]), attn_implementation="eager").eval()
    images = [Image.new("RGB", (96, 64), (200, 10, 10)), Image.new("RGB", (64, 160), (10, 200, 10))]
    batch = collate([vl_embedder.serializer(Item(image=image), None) for image in images], [0, 1], 0)
    assert batch.image_grids == ((1, 4, 6), (1, 10, 4))  # host copy of image_grid_thw
    with FlopCounterMode(display=False) as counter:
        model.get_image_features(batch.pixel_values, batch.image_grid_thw)
    assert vision_flops(vl_embedder.backbone.vision_shape, list(batch.image_grids)) == counter.get_total_flops()


def test_whole_forward_reduction_counts_the_vision_tower_fastE_leaves_alone(vl_embedder, mixed_items):
    full = vl_embedder.encode(mixed_items).stats
    fast = vl_embedder.encode(mixed_items, fast_e=FastEConfig(r_max=0.5, trigger_layer=3)).stats
    grids = [grid for trace in fast.batches for grid in trace.image_grids]
    assert len(grids) == sum(isinstance(i, Item) and i.image is not None for i in mixed_items) > 0
    assert fast.flops_vision == full.flops_vision == vision_flops(vl_embedder.backbone.vision_shape, grids)
    expected = 1 - (fast.flops_realised + fast.flops_vision) / (fast.flops_full + fast.flops_vision)
    assert fast.flops_reduction_with_vision == expected
    assert 0 < fast.flops_reduction_with_vision < fast.flops_reduction
    assert vl_embedder.encode(["text only"]).stats.flops_vision == 0

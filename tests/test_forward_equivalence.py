"""The runner against references: Full vs the HF model's own last_hidden_state, and FastE vs the
naive per-sample token-deleting reference in tests/helpers/reference.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModel, Qwen3VLModel

from faste_mm import FastEConfig

from tests.helpers.reference import init_text_sample, init_vl_sample, naive_embed, pool_last_valid, right_padded, serialized_items
from tests.helpers.inputs import TEXTS

def test_full_forward_matches_qwen3vl_last_hidden_state(vl_embedder, model_dirs, mixed_items):
    serialized = serialized_items(vl_embedder, mixed_items)
    ids, mask, mm = right_padded(serialized, vl_embedder.loaded.pad_token_id)
    pixels = torch.cat([s.pixel_values for s in serialized if s.pixel_values is not None])
    grids = torch.cat([s.image_grid_thw for s in serialized if s.image_grid_thw is not None])
    model = Qwen3VLModel.from_pretrained(str(model_dirs["qwen3_vl"])).eval()
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, pixel_values=pixels, image_grid_thw=grids, mm_token_type_ids=mm)
    expected = pool_last_valid(out.last_hidden_state, mask)
    got = vl_embedder.encode(mixed_items).embeddings
    np.testing.assert_allclose(got, expected, atol=1e-5)


@pytest.mark.parametrize("family", ["qwen3", "mistral", "llama", "qwen2"])
def test_full_forward_matches_hf_decoder_last_hidden_state(text_embedders, model_dirs, family):
    embedder = text_embedders[family]
    serialized = serialized_items(embedder, TEXTS)
    ids, mask, _ = right_padded(serialized, embedder.loaded.pad_token_id)
    model = AutoModel.from_pretrained(str(model_dirs[family])).eval()
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask)
    np.testing.assert_allclose(embedder.encode(TEXTS).embeddings, pool_last_valid(out.last_hidden_state, mask), atol=1e-5)


def _vl_reference(model_dirs, embedder, items, **faste):
    model = Qwen3VLModel.from_pretrained(str(model_dirs["qwen3_vl"])).eval()
    with torch.no_grad():
        samples = [init_vl_sample(model, s) for s in serialized_items(embedder, items)]
        return naive_embed(list(model.language_model.layers), model.language_model.norm, samples, **faste)


def _text_reference(model_dirs, family, embedder, items, **faste):
    model = AutoModel.from_pretrained(str(model_dirs[family])).eval()
    with torch.no_grad():
        samples = [init_text_sample(model, s) for s in serialized_items(embedder, items)]
        return naive_embed(list(model.layers), model.norm, samples, **faste)


def _theta_first_crossing_at(curve, warmup, target):
    """A threshold whose first crossing at or after `warmup` is exactly layer `target`."""
    before = max(curve[warmup:target], default=-1.0)
    assert curve[target] > before + 1e-3, f"tiny model's alignment curve cannot isolate layer {target}: {curve}"
    return (before + curve[target]) / 2


@pytest.mark.parametrize("trigger_layer", [1, 4])  # before and after the DeepStack layers 0..2
@pytest.mark.parametrize("r_max", [0.3, 0.7])
def test_faste_fixed_layer_matches_naive_reference_on_mixed_batch(vl_embedder, model_dirs, mixed_items, trigger_layer, r_max):
    expected, trigger, _ = _vl_reference(model_dirs, vl_embedder, mixed_items, r_max=r_max, trigger_layer=trigger_layer)
    res = vl_embedder.encode(mixed_items, fast_e=FastEConfig(r_max=r_max, trigger_layer=trigger_layer))
    assert [t.trigger_layer for t in res.stats.batches] == [trigger] == [trigger_layer]
    np.testing.assert_allclose(res.embeddings, expected.numpy(), atol=2e-5)


def test_faste_alignment_trigger_matches_naive_reference(vl_embedder, model_dirs, mixed_items):
    _, _, curve = _vl_reference(model_dirs, vl_embedder, mixed_items)
    warmup, target = 2, 4
    theta = _theta_first_crossing_at(curve, warmup, target)
    expected, trigger, _ = _vl_reference(model_dirs, vl_embedder, mixed_items, r_max=0.5, warmup=warmup, theta=theta)
    res = vl_embedder.encode(mixed_items, fast_e=FastEConfig(r_max=0.5, warmup_layer=warmup, threshold=theta))
    assert trigger == target and res.stats.batches[0].trigger_layer == target
    measured = dict(res.stats.batches[0].alignment)
    assert sorted(measured) == list(range(warmup, target + 1))
    np.testing.assert_allclose([measured[l] for l in sorted(measured)], curve[warmup : target + 1], atol=1e-5)
    np.testing.assert_allclose(res.embeddings, expected.numpy(), atol=2e-5)


def test_faste_falls_back_to_last_layer_when_threshold_is_never_reached(vl_embedder, model_dirs, mixed_items):
    expected, trigger, _ = _vl_reference(model_dirs, vl_embedder, mixed_items, r_max=0.5, warmup=2, theta=1.0)
    res = vl_embedder.encode(mixed_items, fast_e=FastEConfig(r_max=0.5, warmup_layer=2, threshold=1.0))
    last = vl_embedder.backbone.shape.num_layers - 1
    assert trigger == last and res.stats.batches[0].trigger_layer == last
    np.testing.assert_allclose(res.embeddings, expected.numpy(), atol=2e-5)


@pytest.mark.parametrize("family", ["qwen3", "mistral"])
def test_faste_text_backbones_match_naive_reference(text_embedders, model_dirs, family):
    embedder = text_embedders[family]
    _, _, curve = _text_reference(model_dirs, family, embedder, TEXTS)
    theta = _theta_first_crossing_at(curve, 1, max(range(2, 6), key=lambda l: curve[l] - max(curve[1:l])))
    for faste in (dict(r_max=0.5, trigger_layer=3), dict(r_max=0.6, warmup=1, theta=theta)):
        expected, trigger, _ = _text_reference(model_dirs, family, embedder, TEXTS, **faste)
        config = FastEConfig(
            r_max=faste["r_max"],
            trigger_layer=faste.get("trigger_layer"),
            warmup_layer=faste.get("warmup"),
            threshold=faste.get("theta"),
        )
        res = embedder.encode(TEXTS, fast_e=config)
        assert res.stats.batches[0].trigger_layer == trigger
        np.testing.assert_allclose(res.embeddings, expected.numpy(), atol=2e-5)


@pytest.mark.parametrize("trigger_layer", [0, 3])
def test_r_max_zero_equals_full_forward(vl_embedder, mixed_items, trigger_layer):
    full = vl_embedder.encode(mixed_items)
    zero = vl_embedder.encode(mixed_items, fast_e=FastEConfig(r_max=0.0, trigger_layer=trigger_layer))
    assert zero.stats.kept_prefix_tokens == zero.stats.prefix_tokens
    np.testing.assert_allclose(zero.embeddings, full.embeddings, atol=1e-6)

"""The decoder MLP block as three fused oneDNN calls (model/cpu/decoder_kernels.py) against
transformers' MLP module and residual, and the whole decoder with it forced either way against
transformers' bf16 model; FastE's decisions with it fused equal those of the naive reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from faste_mm.model.cpu.decoder_kernels import DecoderMlp, can_fuse_mlp, mlp_residual
from faste_mm.model.cpu.kernel_choice import DECODER_MLP_ENV, KernelTrials

needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="the fused path is oneDNN's")


def _mlp(dtype):
    from transformers import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP

    torch.manual_seed(0)
    return Qwen3MLP(Qwen3Config(hidden_size=64, intermediate_size=96, hidden_act="silu")).to(dtype).eval()


@needs_onednn
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_mlp_residual_equals_transformers_mlp_plus_residual(dtype):
    mlp = _mlp(dtype)
    x, residual = torch.randn(2, 17, 64).to(dtype), torch.randn(2, 17, 64).to(dtype)
    assert can_fuse_mlp(mlp, x)
    with torch.inference_mode():
        fused, separate = mlp_residual(mlp, x, residual, fused=True), mlp_residual(mlp, x, residual, fused=False)
        reference = mlp.double()(x.double()) + residual.double()
    assert fused.dtype == dtype and fused.shape == residual.shape
    # bf16: fused rounds the gate, the product and the sum once each inside oneDNN, separate once more
    tolerance = 1e-5 if dtype == torch.float32 else 2 ** -6 * float(reference.abs().max())
    for got in (fused, separate):
        torch.testing.assert_close(got.double(), reference, atol=tolerance, rtol=0)


def test_int8_or_other_activations_run_transformers_module():
    mlp = _mlp(torch.float32)
    assert not can_fuse_mlp(mlp, torch.randn(3, 64).bfloat16())  # weights of another dtype
    mlp.act_fn = torch.nn.GELU()
    assert not can_fuse_mlp(mlp, torch.randn(3, 64))


@needs_onednn
def test_an_int8_mlp_runs_its_modules():
    from faste_mm.model.cpu.int8 import quantize_model

    quantized = _mlp(torch.bfloat16)
    assert quantize_model(quantized) == 3  # `--dtype int8`'s layers
    x, residual = torch.randn(3, 64).bfloat16(), torch.randn(3, 64).bfloat16()
    assert not can_fuse_mlp(quantized, x)
    trials = KernelTrials("decoder MLP", "fused", None)  # even asked for fused
    torch.testing.assert_close(DecoderMlp(frozenset(), trials=trials)(quantized, x, residual), residual + quantized(x))


@needs_onednn
@pytest.mark.parametrize("choice", ["fused", "separate"])
def test_bf16_decoder_with_mlp_either_way_is_within_bf16_tolerance_of_transformers(model_dirs, mixed_items, choice, monkeypatch):
    from transformers import Qwen3VLModel

    from faste_mm import Embedder
    from tests.helpers.reference import pool_last_valid, right_padded, serialized_items

    monkeypatch.setenv(DECODER_MLP_ENV, choice)
    embedder = Embedder.from_pretrained(str(model_dirs["qwen3_vl"]), device="cpu", dtype="bfloat16")
    serialized = serialized_items(embedder, mixed_items)
    ids, mask, mm = right_padded(serialized, embedder.loaded.pad_token_id)
    pixels = torch.cat([s.pixel_values for s in serialized if s.pixel_values is not None])
    grids = torch.cat([s.image_grid_thw for s in serialized if s.image_grid_thw is not None])
    model = Qwen3VLModel.from_pretrained(str(model_dirs["qwen3_vl"]), dtype=torch.bfloat16).eval()
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, pixel_values=pixels.bfloat16(), image_grid_thw=grids,
                    mm_token_type_ids=mm)
    expected = pool_last_valid(out.last_hidden_state.float(), mask)
    got = embedder.encode(mixed_items).embeddings
    assert {c.choice for c in embedder.backbone.mlp.trials.choices.values()} == {choice}
    assert any(DECODER_MLP_ENV in line for line in embedder.kernel_choices())
    cosine = (got * expected).sum(-1) / np.linalg.norm(got, axis=-1) / np.linalg.norm(expected, axis=-1)
    assert cosine.min() > 0.999, cosine


def test_trial_settles_once_per_bucket_and_keeps_the_winner():
    mlp = _mlp(torch.float32)
    ticks = iter(range(100))
    trials = KernelTrials("decoder MLP", "auto", None, timer=lambda run: (next(ticks), run()), variable=DECODER_MLP_ENV)
    decoder_mlp = DecoderMlp(frozenset(), trials=trials)
    x, residual = torch.randn(5, 64), torch.randn(5, 64)
    with torch.inference_mode():
        first = decoder_mlp(mlp, x, residual)
        decoder_mlp(mlp, x, residual)
    (choice,) = trials.choices.values()
    assert choice.how == "measured" and choice.choice == "fused"  # the first timed (0 s) wins ties of ordering
    torch.testing.assert_close(first, mlp(x) + residual, atol=1e-5, rtol=0)

"""Unpadded layers after compression: packed rows give the padded layers' vectors on every
family (DeepStack, GQA, QK-norm, biases), sliding windows fall back to padding, and "auto"
settles by a trial that times, checks and records every candidate."""

from __future__ import annotations

import json
import shutil
import time

import numpy as np
import pytest
import torch

from faste_mm import BatchingConfig, Embedder, FastEConfig
from faste_mm.model.batching import UNPADDED_MODES
from faste_mm.model import unpadded as unpadded_module
from faste_mm.errors import ConfigError
from faste_mm.model.unpadded import KERNELS, PADDED, Unpadded, attend_segments

from tests.helpers.inputs import TEXTS


def _layout(embedder: Embedder, mode: str) -> Embedder:
    return embedder.with_batching(BatchingConfig(unpadded=mode))


@pytest.mark.parametrize("trigger_layer", [1, 4])  # inside and after the DeepStack layers 0..2
@pytest.mark.parametrize("r_max", [0.3, 0.7])
def test_packed_layers_equal_padded_layers_on_mixed_vl_batch(vl_embedder, mixed_items, trigger_layer, r_max):
    config = FastEConfig(r_max=r_max, trigger_layer=trigger_layer)
    padded = _layout(vl_embedder, "off").encode(mixed_items, fast_e=config)
    packed = _layout(vl_embedder, "segments").encode(mixed_items, fast_e=config)
    assert [t.attention for t in padded.stats.batches] == [PADDED]
    assert [t.attention for t in packed.stats.batches] == ["segments"]
    assert packed.stats.attention == {"segments": 1}
    assert len(set(packed.stats.batches[0].padded_lengths[trigger_layer:])) == 1
    assert packed.stats.flops_realised == padded.stats.flops_realised
    np.testing.assert_allclose(packed.embeddings, padded.embeddings, atol=1e-5)


@pytest.mark.parametrize("family", ["qwen3", "qwen2", "mistral", "llama"])
def test_packed_layers_equal_padded_layers_on_text_backbones(text_embedders, family):
    embedder = text_embedders[family]
    for config in (FastEConfig(r_max=0.5, trigger_layer=2), FastEConfig(r_max=0.6, warmup_layer=1, threshold=-1.0)):
        padded = _layout(embedder, "off").encode(TEXTS, fast_e=config)
        packed = _layout(embedder, "segments").encode(TEXTS, fast_e=config)
        assert [t.attention for t in packed.stats.batches] == ["segments"]
        assert [t.trigger_layer for t in packed.stats.batches] == [t.trigger_layer for t in padded.stats.batches]
        np.testing.assert_allclose(packed.embeddings, padded.embeddings, atol=1e-5)


def test_full_forward_never_packs(vl_embedder, mixed_items):
    result = _layout(vl_embedder, "segments").encode(mixed_items)
    assert result.stats.attention == {} and [t.attention for t in result.stats.batches] == [PADDED]


def test_sliding_window_shorter_than_the_rows_keeps_the_padded_layers(model_dirs, tmp_path):
    """Mistral's sliding-window mask equals plain causal attention only while rows fit the
    window; a longer batch must stay padded (and still give the padded vectors)."""
    model_dir = tmp_path / "mistral-window-8"
    shutil.copytree(model_dirs["mistral"], model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "sliding_window": 8}))
    texts = ["short one", "the quick brown fox jumps over the lazy dog " * 3]
    fast_e = FastEConfig(r_max=0.3, trigger_layer=2)
    padded = Embedder.from_pretrained(str(model_dir), batching=BatchingConfig(unpadded="off")).encode(texts, fast_e=fast_e)
    asked = Embedder.from_pretrained(str(model_dir), batching=BatchingConfig(unpadded="segments")).encode(texts, fast_e=fast_e)
    assert [t.attention for t in asked.stats.batches] == [PADDED]
    assert asked.stats.batches[0].padded_lengths[2] > 8
    np.testing.assert_allclose(asked.embeddings, padded.embeddings, atol=1e-6)
    short = Embedder.from_pretrained(str(model_dir), batching=BatchingConfig(unpadded="segments")).encode(["a b"], fast_e=fast_e)
    assert [t.attention for t in short.stats.batches] == ["segments"]  # fits the window: packed


class _TrialClock:
    """The trial's clock: real time plus what slowed kernels add, so "slow" is slow however
    loaded the machine is (a real sleep loses to a padded run on a busy CI core)."""

    def __init__(self) -> None:
        self.added = 0.0

    def perf_counter(self) -> float:
        return time.perf_counter() + self.added


class _CountingKernel:
    """A candidate kernel for the trial: the segments kernel, optionally slowed or corrupted."""

    def __init__(self, clock: _TrialClock | None = None, delay_s: float = 0.0, corrupt: bool = False, fail: bool = False) -> None:
        self.clock, self.delay_s, self.corrupt, self.fail, self.calls = clock, delay_s, corrupt, fail, 0

    def __call__(self, q, k, v, packed, scale):
        self.calls += 1
        if self.fail:
            raise RuntimeError("no kernel image is available for execution on the device")
        if self.clock is not None:
            self.clock.added += self.delay_s
        out = attend_segments(q, k, v, packed, scale)
        return -out if self.corrupt else out


def test_auto_trial_times_checks_and_records_candidates_once(vl_embedder, mixed_items, monkeypatch):
    clock = _TrialClock()
    monkeypatch.setattr(unpadded_module, "time", clock)
    slow, wrong, broken = _CountingKernel(clock, delay_s=60.0), _CountingKernel(corrupt=True), _CountingKernel(fail=True)
    embedder = _layout(vl_embedder, "auto")
    embedder.unpadded = Unpadded("auto", torch.device("cpu"), torch.float32, candidates={
        "segments": KERNELS["segments"], "slow": slow, "wrong": wrong, "broken": broken,
    })
    config = FastEConfig(r_max=0.5, trigger_layer=3)
    first = embedder.encode(mixed_items, fast_e=config)
    trial = first.stats.attention_trial
    assert set(trial) == {PADDED, "segments", "slow", "wrong", "broken"}
    assert trial["broken"].startswith("failed: RuntimeError") and trial["wrong"].startswith("rejected: readout cosine")
    timed = {name: seconds for name, seconds in trial.items() if isinstance(seconds, float)}
    assert set(timed) == {PADDED, "segments", "slow"}
    remaining = vl_embedder.backbone.shape.num_layers - 3
    assert timed["slow"] >= remaining * 60.0  # the timed run alone: every remaining layer is slowed
    choice = min(timed, key=timed.get)
    assert choice != "slow" and [t.attention for t in first.stats.batches] == [choice]
    calls = slow.calls
    second = embedder.encode(mixed_items, fast_e=config)  # settled: no second trial
    assert slow.calls == calls and second.stats.attention == {choice: 1}
    baseline = _layout(vl_embedder, "off").encode(mixed_items, fast_e=config)
    np.testing.assert_allclose(first.embeddings, baseline.embeddings, atol=1e-5)


def test_auto_on_a_cpu_packs_with_segments_without_a_trial(text_embedders):
    result = _layout(text_embedders["qwen3"], "auto").encode(TEXTS, fast_e=FastEConfig(r_max=0.5, trigger_layer=2))
    assert result.stats.attention == {"segments": 1} and result.stats.attention_trial == {}


def test_unpadded_settings_are_validated_with_the_valid_choices():
    assert set(UNPADDED_MODES) == {"auto", "off", *KERNELS}
    with pytest.raises(ConfigError, match="unpadded must be one of auto, off, flash-attn"):
        BatchingConfig(unpadded="xformers")
    with pytest.raises(ConfigError, match="'flash-attn' needs a CUDA device"):
        Unpadded("flash-attn", torch.device("cpu"), torch.float32)
    with pytest.raises(ConfigError, match="'torch-nested' needs a CUDA device"):
        Unpadded("torch-nested", torch.device("cpu"), torch.float32)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA kernels; run on a GPU machine")
@pytest.mark.parametrize("name", ["torch-nested", "flash-attn"])
def test_cuda_kernels_match_the_segments_reference(name):
    from faste_mm.model.decoder_state import PackedState
    from faste_mm.model.unpadded import kernel_unavailable

    device, dtype = torch.device("cuda"), torch.bfloat16
    if kernel_unavailable(name, device, dtype):
        pytest.skip(kernel_unavailable(name, device, dtype))
    lengths = (37, 5, 128, 64)
    n = sum(lengths)
    q, k, v = (torch.randn(n, heads, 128, device=device, dtype=dtype) for heads in (16, 8, 8))
    cu = torch.tensor([0, *np.cumsum(lengths)], device=device, dtype=torch.int32)
    empty = torch.empty(n, 128, device=device, dtype=dtype)
    packed = PackedState(hidden=empty, cos=empty, sin=empty, cu_seqlens=cu, offsets=cu.long(), lengths=lengths)
    expected = attend_segments(q, k, v, packed, 128**-0.5).float()
    got = KERNELS[name](q, k, v, packed, 128**-0.5).float()
    torch.testing.assert_close(got, expected, atol=2e-2, rtol=2e-2)

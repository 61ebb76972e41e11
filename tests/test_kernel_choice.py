"""Kernel choices by measurement (model/cpu/kernel_choice.py): the tower's attention dtype trial picks
whichever candidate is measured faster (timings injected), its disk cache is keyed by the CPU's
flags and torch's version and ignored when either differs, the override wins, and the tower in
either attention dtype stays within bfloat16 tolerance of transformers' bfloat16 tower."""

from __future__ import annotations

import json

import pytest
import torch

from faste_mm.errors import ConfigError
from faste_mm.model.backbones.vision_tower import PackedVisionTower
from faste_mm.model.cpu.kernel_choice import (TOWER_ATTENTION_DTYPE_ENV, KernelTrials, TrialCache, machine_key,
                                              requested_attention_dtype)


def scripted(seconds: dict[str, float]):
    """A timer that reports the given seconds per candidate (by the dtype of its result)."""
    def timer(run):
        result = run()
        return seconds[str(result.dtype).removeprefix("torch.")], result
    return timer


def tiny_visual(model_dirs, dtype=torch.bfloat16):
    from transformers import Qwen3VLModel

    return Qwen3VLModel.from_pretrained(str(model_dirs["qwen3_vl"]), dtype=dtype).eval().visual


def pixels_for(visual, grids, seed=1):
    config = visual.config
    torch.manual_seed(seed)
    width = config.in_channels * config.temporal_patch_size * config.patch_size**2
    return torch.randn(int(grids.prod(-1).sum()), width)


@pytest.mark.parametrize("seconds, expected", [
    ({"float32": 2.0, "bfloat16": 0.8}, "bfloat16"),
    ({"float32": 0.5, "bfloat16": 2.2}, "float32"),
])
def test_trial_chooses_the_dtype_measured_faster(model_dirs, tmp_path, seconds, expected):
    visual = tiny_visual(model_dirs)
    cache = TrialCache(machine_key(frozenset({"amx_bf16"})), tmp_path / "k.json")
    trials = KernelTrials("tower attention", "auto", cache, timer=scripted(seconds))
    grids = torch.tensor([[1, 8, 6]])
    with torch.inference_mode():
        PackedVisionTower(visual, attention="sdpa", trials=trials)(pixels_for(visual, grids).bfloat16(), grids)
    (choice,) = trials.choices.values()
    assert choice.choice == expected and choice.how == "measured" and choice.seconds == seconds
    slower = "float32" if expected == "bfloat16" else "bfloat16"
    assert choice.describe().startswith(f"tower attention: {expected}, measured {max(seconds.values()) / min(seconds.values()):.1f}x {slower}")
    stored = json.loads((tmp_path / "k.json").read_text())
    assert stored["entries"][choice.bucket]["choice"] == expected


def test_cached_verdict_is_reused_on_the_same_cpu_and_torch_and_ignored_otherwise(tmp_path):
    path = tmp_path / "k.json"
    here = machine_key(frozenset({"avx512_bf16", "amx_bf16"}), "2.14.1")
    TrialCache(here, path).put("cpu bfloat16 16x64 frames<=8192", "bfloat16", {"float32": 2.0, "bfloat16": 0.8})
    same = KernelTrials("tower attention", "auto", TrialCache(machine_key(frozenset({"amx_bf16", "avx512_bf16"}), "2.14.1"), path))
    choice = same.settled("cpu bfloat16 16x64 frames<=8192")
    assert choice.choice == "bfloat16" and choice.how == "cached" and "2.5x float32" in choice.describe()
    for other in (machine_key(frozenset({"avx512_bf16"}), "2.14.1"), machine_key(frozenset({"avx512_bf16", "amx_bf16"}), "2.15.0")):
        assert KernelTrials("tower attention", "auto", TrialCache(other, path)).settled("cpu bfloat16 16x64 frames<=8192") is None
    # another machine's write replaces the file: the verdicts of this one are not mixed with it
    TrialCache(machine_key(frozenset({"avx2"}), "2.14.1"), path).put("b", "float32", {})
    assert TrialCache(here, path).get("cpu bfloat16 16x64 frames<=8192") is None


def test_a_verdict_from_the_older_single_run_trial_is_measured_again(tmp_path):
    # caches written before the mirrored trial carry no trial method in their machine key
    path = tmp_path / "k.json"
    flags = frozenset({"avx512_bf16", "amx_bf16"})
    old_key = machine_key(flags, "2.14.1").rsplit(" trial:", 1)[0]
    TrialCache(old_key, path).put("cpu bfloat16 linear 4096->4096 gelu(none) rows<=512", "separate", {"fused": 3.8, "separate": 1.0})
    assert TrialCache(old_key, path).get("cpu bfloat16 linear 4096->4096 gelu(none) rows<=512") is not None
    assert TrialCache(machine_key(flags, "2.14.1"), path).get("cpu bfloat16 linear 4096->4096 gelu(none) rows<=512") is None


def test_unreadable_cache_is_ignored_and_the_trial_runs(tmp_path):
    path = tmp_path / "k.json"
    path.write_text("{not json")
    assert TrialCache("m", path).get("b") is None
    TrialCache("m", path).put("b", "float32", {"float32": 1.0})
    assert TrialCache("m", path).get("b") == {"choice": "float32", "seconds": {"float32": 1.0}}


def test_override_forces_the_dtype_without_a_trial(model_dirs, monkeypatch):
    visual = tiny_visual(model_dirs)

    def refuse(run):
        raise AssertionError("no trial when the dtype is asked for")

    monkeypatch.setenv(TOWER_ATTENTION_DTYPE_ENV, "float32")
    trials = KernelTrials("tower attention", requested_attention_dtype(), None, timer=refuse)
    grids = torch.tensor([[1, 4, 6]])
    with torch.inference_mode():
        PackedVisionTower(visual, attention="sdpa", trials=trials)(pixels_for(visual, grids).bfloat16(), grids)
    (choice,) = trials.choices.values()
    assert (choice.choice, choice.how) == ("float32", "asked") and TOWER_ATTENTION_DTYPE_ENV in choice.describe()


def test_unknown_attention_dtype_is_refused_naming_the_variable(monkeypatch):
    monkeypatch.setenv(TOWER_ATTENTION_DTYPE_ENV, "int4")
    with pytest.raises(ConfigError, match=f"{TOWER_ATTENTION_DTYPE_ENV} must be one of auto, float32, bfloat16, got 'int4'"):
        requested_attention_dtype()
    with pytest.raises(ConfigError, match="tower attention dtype must be one of"):
        requested_attention_dtype("fp8")


@pytest.mark.parametrize("attention_dtype", ["float32", "bfloat16"])
def test_tower_in_either_attention_dtype_is_within_bf16_tolerance_of_transformers(model_dirs, attention_dtype):
    """Both candidates the trial may pick give transformers' bfloat16 tower's features within
    bfloat16 rounding (a page-like single frame and a run of photos)."""
    visual = tiny_visual(model_dirs)
    for grids in (torch.tensor([[1, 8, 6]]), torch.tensor([[1, 4, 6], [1, 4, 6], [1, 8, 4]])):
        pixels = pixels_for(visual, grids).bfloat16()
        with torch.inference_mode():
            expected = visual(pixels, grid_thw=grids, return_dict=True).pooler_output.float()
            got = PackedVisionTower(visual, attention="sdpa", attention_dtype=attention_dtype)(pixels, grids).merged.float()
        cosine = torch.nn.functional.cosine_similarity(got, expected, dim=-1)
        assert cosine.min() > 0.999, cosine.min()
        torch.testing.assert_close(got, expected, atol=0.05 * float(expected.abs().max()), rtol=0)


def test_float32_tower_has_nothing_to_choose(model_dirs):
    visual = tiny_visual(model_dirs, torch.float32)
    trials = KernelTrials("tower attention", "auto", None, timer=lambda run: pytest.fail("no trial in float32"))
    grids = torch.tensor([[1, 4, 6]])
    with torch.inference_mode():
        PackedVisionTower(visual, attention="sdpa", trials=trials)(pixels_for(visual, grids), grids)
    assert trials.choices == {}


def test_trial_times_each_candidate_twice_in_mirrored_order_and_keeps_its_best():
    """A burst of other work during one run must not decide the verdict: A B then B A, best of each."""
    from faste_mm.model.cpu.kernel_choice import fastest

    order, reported = [], iter([5.0, 1.0, 1.2, 0.5])  # A's first run was slowed down by something else

    def timer(run):
        order.append(run())
        return next(reported), torch.tensor(0.0)

    best, seconds, _ = fastest({"A": lambda: "A", "B": lambda: "B"}, timer)
    assert order == ["A", "B", "B", "A"] and best == "A" and seconds == {"A": 0.5, "B": 1.0}

"""`--dtype int8` is accepted only where a measured trial on this CPU finds oneDNN's int8 linear
faster than the rest dtype's (model/cpu/int8.py `int8_trial`): the same flags can hide a slow kernel
(an AMD EPYC with avx512_vnni ran it 2,000x slower than bfloat16). Timers are injected, so each
verdict below is decided by the test, not by the machine the suite runs on; the real trial runs
once, on the probe alone where int8 is slow."""

from __future__ import annotations

import pytest
import torch

from faste_mm.errors import ConfigError
from faste_mm.model.backbones.loading import choose_dtype
from faste_mm.model.cpu.int8 import MARGIN, PROBE_SHAPE, TRIAL_SHAPE, Int8Trial, int8_trial, trial_bucket
from faste_mm.model.cpu.kernel_choice import TrialCache, machine_key

VNNI = frozenset({"avx512_vnni", "avx512_bf16"})


class ShapeTimer:
    """A timer that runs nothing: int8's calls take `int8_s(rows, codes)`, the rest dtype's 1 ms, and the
    rows of every timed call are recorded (which shapes the trial reached)."""

    def __init__(self, int8_s) -> None:
        self.int8_s = int8_s  # (rows, activation codes) -> seconds
        self.rows: list[int] = []
        self.codes: list[str | None] = []  # each timed call's activation codes (None: the rest dtype)

    def __call__(self, run):
        layer = next((cell.cell_contents for cell in run.__closure__ or ()
                      if type(cell.cell_contents).__name__ == "Int8Linear"), None)
        x = next(cell.cell_contents for cell in run.__closure__ if isinstance(cell.cell_contents, torch.Tensor))
        self.rows.append(x.shape[0])
        self.codes.append(None if layer is None else layer.codes)
        return (self.int8_s(x.shape[0], layer.codes) if layer is not None else 1e-3), x


@pytest.fixture
def cache(tmp_path):
    return TrialCache(machine_key(VNNI), tmp_path / "kernel_choices.json")


@pytest.fixture(autouse=True)
def with_the_trial(monkeypatch):
    monkeypatch.delenv("FASTE_MM_INT8_TRIAL", raising=False)


def test_a_slow_int8_kernel_is_caught_by_the_probe_without_running_the_full_shape(cache):
    timer = ShapeTimer(lambda rows, codes: 2.0)  # 2,000x the rest dtype: a reference kernel
    verdict = int8_trial(torch.bfloat16, VNNI, cache, timer)
    assert not verdict.accepted and verdict.shape == PROBE_SHAPE and verdict.how == "measured"
    assert set(timer.rows) == {PROBE_SHAPE[0]}  # TRIAL_SHAPE was never run
    assert verdict.speedup == pytest.approx(1e-3 / 2.0)
    assert "int8 linear (u8 activations) 0.0005x bfloat16 at 32x256x256" in verdict.describe()


def test_int8_faster_by_the_margin_at_the_full_shape_is_accepted(cache):
    timer = ShapeTimer(lambda rows, codes: 0.5e-3)
    verdict = int8_trial(torch.bfloat16, VNNI, cache, timer)
    assert verdict.accepted and verdict.shape == TRIAL_SHAPE and verdict.speedup == pytest.approx(2.0)
    assert set(timer.rows) == {PROBE_SHAPE[0], TRIAL_SHAPE[0]}


@pytest.mark.parametrize("fast, slow", [("u8", "s8"), ("s8", "u8")])
def test_the_faster_activation_codes_are_kept_and_the_slow_ones_stop_at_the_probe(cache, fast, slow):
    """oneDNN multiplies uint8 codes on VNNI and int8 ones only on AMX: whichever is a reference
    kernel here stops at the probe, and the verdict names the codes int8 then runs with."""
    timer = ShapeTimer(lambda rows, codes: 0.5e-3 if codes == fast else 2.0)
    verdict = int8_trial(torch.bfloat16, VNNI, cache, timer)
    assert verdict.accepted and verdict.codes == fast and verdict.shape == TRIAL_SHAPE
    assert f"({fast} activations)" in verdict.describe()
    at_full = {codes for rows, codes in zip(timer.rows, timer.codes) if rows == TRIAL_SHAPE[0]}
    assert at_full == {fast, None}  # the slow codes never ran the full shape


def test_int8_within_the_margin_of_bfloat16_is_refused(cache):
    slightly = MARGIN * 1e-3 * 1.05  # faster than bfloat16, but by less than the margin
    verdict = int8_trial(torch.bfloat16, VNNI, cache, ShapeTimer(lambda rows, codes: slightly))
    assert not verdict.accepted and verdict.shape == TRIAL_SHAPE


def test_the_verdict_is_cached_for_this_cpu_model_and_torch_and_not_for_another(cache, tmp_path):
    first = int8_trial(torch.bfloat16, VNNI, cache, ShapeTimer(lambda rows, codes: 2.0))
    never = ShapeTimer(lambda rows, codes: pytest.fail("a cached verdict must not be measured again"))
    again = int8_trial(torch.bfloat16, VNNI, cache, never)
    assert again.how == "cached" and (again.accepted, again.int8_s, again.shape) == (first.accepted, first.int8_s, first.shape)
    assert "measured earlier (cached)" in again.describe()
    other_cpu = TrialCache(machine_key(VNNI, cpu_model="another CPU"), cache.path)
    assert other_cpu.get(trial_bucket("bfloat16")) is None


def test_dtype_int8_refused_by_its_trial_says_what_was_measured_and_what_to_use(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTE_MM_KERNEL_CACHE", str(tmp_path / "k.json"))
    flags = lambda: VNNI  # noqa: E731
    slow = Int8Trial(False, 0.03, 1e-4, "bfloat16", PROBE_SHAPE, "measured")
    TrialCache(machine_key(VNNI)).put(trial_bucket("bfloat16"), "bfloat16",
                                      {}, verdict={k: getattr(slow, k) for k in ("accepted", "int8_s", "rest_s", "rest", "shape")})
    with pytest.raises(ConfigError, match=r"dtype int8 is slower than bfloat16 on this CPU \(int8 linear \(u8 activations\) 0.0033x "
                                          r"bfloat16 at 32x256x256 .* use dtype auto \(bfloat16 here\); "
                                          r"FASTE_MM_INT8_TRIAL=skip"):
        choose_dtype("int8", torch.device("cpu"), cpu_flags=flags)
    monkeypatch.setenv("FASTE_MM_INT8_TRIAL", "skip")
    assert choose_dtype("int8", torch.device("cpu"), cpu_flags=flags).dtype == torch.int8


def test_the_real_trial_on_this_cpu_reaches_a_verdict_and_refusal_names_it(tmp_path):
    """Whatever this CPU is: a verdict with both seconds measured; a refusal where it is slower."""
    verdict = int8_trial(torch.bfloat16, VNNI, TrialCache("test", tmp_path / "k.json"))
    assert verdict.int8_s > 0 and verdict.rest_s > 0 and verdict.how == "measured"
    assert verdict.accepted == (verdict.shape == TRIAL_SHAPE and verdict.int8_s <= MARGIN * verdict.rest_s)


def refuse_int8_here(monkeypatch, tmp_path) -> None:
    """This machine's kernel cache holds a measured verdict against int8 (as on a slow kernel)."""
    from faste_mm.model.backbones.loading import read_cpu_flags

    monkeypatch.setenv("FASTE_MM_KERNEL_CACHE", str(tmp_path / "k.json"))
    slow = {"accepted": False, "int8_s": 0.03, "rest_s": 1e-4, "rest": "bfloat16", "shape": list(PROBE_SHAPE)}
    for rest in ("bfloat16", "float32"):
        TrialCache(machine_key(read_cpu_flags())).put(
            trial_bucket(rest), rest, {}, verdict={**slow, "rest": rest})


def test_plan_leaves_out_int8_refused_by_its_trial_and_says_why(vl_embedder, image_dir, monkeypatch, tmp_path):
    from faste_mm import Item
    from faste_mm.model.backbones.loading import read_cpu_flags
    from faste_mm.model.cpu.int8 import CPU_INT8_FLAGS
    from faste_mm.tools.plan import PlanConfig, plan

    if not any(flag in read_cpu_flags() for flag in CPU_INT8_FLAGS):
        pytest.skip("this CPU has no int8 dot products: int8 is refused before any trial")
    refuse_int8_here(monkeypatch, tmp_path)
    items = [Item(text="a red bicycle"), Item(text="a blue boat"), Item(image=image_dir / "red.png")]
    report = plan(vl_embedder, items, PlanConfig(max_pixels=(1_843_200,), r_max=(0.0,), dtypes=("float32", "int8")))
    assert {c.dtype for c in report.candidates} == {"float32"}
    assert "slower than" in report.left_out["int8"] and "measured earlier (cached)" in report.left_out["int8"]
    assert report.to_dict()["left_out"] == report.left_out
    with pytest.raises(ConfigError, match="plan: no dtype left to compare"):
        plan(vl_embedder, items, PlanConfig(max_pixels=(1_843_200,), r_max=(0.0,), dtypes=("int8",)))

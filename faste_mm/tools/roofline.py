"""The roofline `faste-mm bench` judges CPU (and GPU) speed by: this machine's matrix-multiply rate
per dtype, measured with a short calibrated GEMM (at the start of a run; `bench cpu` again beside each
input kind's rounds, as the rate of a shared VM drifts), and per stage of the forward
(vision tower, decoder) the achieved TFLOP/s (the FLOP counts of `model/flops.py` over the stage's
seconds) and its fraction of the rate in the dtype the model ran in.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass

import torch

from faste_mm.errors import ConfigError

# A square GEMM the size of a 2B model's projections: large enough for AMX/tensor cores to reach
# their rate, small enough (17 GFLOP) that calibration stays a fraction of a second per dtype.
GEMM_SIZE = 2048
RATE_DTYPES = ("bfloat16", "float32", "int8")
# the GEMM that predicts how long one at GEMM_SIZE would take (a slow kernel is measured smaller);
# not much smaller than GEMM_SIZE, as small GEMMs run below the rate and would predict too long
PROBE_SIZE = 512

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class MatmulRate:
    """One dtype's measured rate: the best of `repeats` timed GEMMs after a warm-up."""

    dtype: str
    tflops: float  # 10^12 multiply-adds x 2 per second
    size: int  # M = N = K
    repeats: int
    kernel: str  # what multiplied: "matmul" or the int8 path's quantized linear

    def to_dict(self) -> dict:
        return asdict(self)


def measure_rates(device: torch.device, dtypes: tuple[str, ...] = RATE_DTYPES, budget_s: float = 0.6,
                  size: int = GEMM_SIZE) -> dict[str, MatmulRate]:
    """The rate of each of `dtypes` (pass only those being measured) on `device`; int8 only where
    `--dtype int8` is accepted (its trial says it is faster here), through the same quantized
    linear layer that path runs. `budget_s` bounds each dtype's time: the timed repeats (at least
    2), and the GEMM's size, halved until one call is predicted to fit (a slow kernel is measured
    at a smaller size instead of stalling the run)."""
    rates = {}
    for dtype in dict.fromkeys(dtypes):
        try:
            make = _gemm(dtype, device)
        except ConfigError as refused:  # int8 where `--dtype int8` is refused: its trial, a GPU, no int8 dot products
            log.info("no %s rate: %s", dtype, refused)
            continue
        rates[dtype] = _calibrated(make, dtype, _bounded_size(make, size, device, budget_s), device, budget_s)
    return rates


def _gemm(dtype: str, device: torch.device):
    """A maker: size -> (one GEMM call, the kernel's name); ConfigError where int8 is refused."""
    rest = None
    if dtype == "int8":  # the layer `--dtype int8` runs, on the dtype around it where the CPU has bfloat16
        from faste_mm.model.backbones.loading import choose_dtype

        rest = choose_dtype("int8", device).rest

    def make(size: int):
        generator = torch.Generator().manual_seed(0)
        a = torch.randn(size, size, generator=generator)
        b = torch.randn(size, size, generator=generator)
        if rest is not None:
            from faste_mm.model.cpu.int8 import Int8Linear

            layer = Int8Linear(torch.nn.Linear(size, size, bias=False))
            a = a.to(rest)
            return (lambda: layer(a)), f"int8 linear (oneDNN, per-token activations, {str(rest).removeprefix('torch.')} in/out)"
        a, b = a.to(device, getattr(torch, dtype)), b.to(device, getattr(torch, dtype))
        return (lambda: a @ b), "matmul"

    return make


def _timed_once(run, device: torch.device) -> float:
    started = time.perf_counter()
    run()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - started


@torch.inference_mode()
def _bounded_size(make, size: int, device: torch.device, budget_s: float) -> int:
    """`size`, or a smaller power-of-two fraction of it where a `PROBE_SIZE` GEMM predicts that one
    call at `size` would take more than `budget_s` (time grows with the cube of the size)."""
    if size <= PROBE_SIZE:
        return size
    run, _ = make(PROBE_SIZE)
    run()  # warm-up
    predicted = _timed_once(run, device) * (size / PROBE_SIZE) ** 3
    while size > PROBE_SIZE and predicted > budget_s:
        size, predicted = size // 2, predicted / 8
    return size


@torch.inference_mode()
def _calibrated(make, dtype: str, size: int, device: torch.device, budget_s: float) -> MatmulRate:
    run, kernel = make(size)
    run()  # warm-up: kernel selection, AMX tile setup, allocator
    first = _timed_once(run, device)
    repeats = max(2, min(50, int(budget_s / max(first, 1e-6))))
    best = min([first] + [_timed_once(run, device) for _ in range(repeats - 1)])
    return MatmulRate(dtype, 2 * size**3 / best / 1e12, size, repeats, kernel)


def mean_rate(before: MatmulRate, after: MatmulRate) -> MatmulRate:
    """One rate from two calibrations around a timed run (the machine's rate drifts on a shared
    VM): their mean, with the repeats of both."""
    return MatmulRate(before.dtype, (before.tflops + after.tflops) / 2, before.size,
                      before.repeats + after.repeats, before.kernel)


@dataclass(frozen=True, slots=True)
class StageRate:
    """One stage of the forward against the roofline."""

    stage: str  # "tower" or "decoder"
    flops: int
    seconds: float
    tflops: float  # achieved
    peak_tflops: float  # the measured GEMM rate in the dtype it ran in
    fraction: float  # achieved / peak

    def to_dict(self) -> dict:
        return asdict(self)


def stage_rates(stages: dict[str, tuple[int, float]], dtype: str, rates: dict[str, MatmulRate]) -> dict[str, StageRate]:
    """{stage: (flops, seconds)} -> {stage: StageRate} against `rates[dtype]`; stages with no
    FLOPs or no time (a text-only run's tower) are left out, as is everything without a rate."""
    rate = rates.get(dtype)
    out = {}
    for stage, (flops, seconds) in stages.items():
        if rate is None or flops <= 0 or seconds <= 0:
            continue
        achieved = flops / seconds / 1e12
        out[stage] = StageRate(stage, int(flops), seconds, achieved, rate.tflops, achieved / rate.tflops)
    return out

"""The roofline's GEMM calibration (tools/roofline.py) is bounded per dtype: a kernel too slow for
the full-size GEMM is measured at a smaller size instead of stalling `faste-mm bench` (on an AMD
EPYC oneDNN's int8 linear ran 2,000x slower than bfloat16: one 2048^3 call would take minutes)."""

from __future__ import annotations

import time

import torch

from faste_mm.tools.roofline import GEMM_SIZE, PROBE_SIZE, _bounded_size, measure_rates


def test_a_kernel_too_slow_for_the_budget_is_measured_at_the_probe_size():
    sizes = []

    def make(size: int):
        sizes.append(size)
        # at least 50 ms a call at the probe: 2048^3 would take >= 3.2 s and 1024^3 >= 0.4 s, past a 0.1 s budget
        return (lambda: time.sleep(0.05)), "slow"

    assert _bounded_size(make, GEMM_SIZE, torch.device("cpu"), 0.1) == PROBE_SIZE
    assert sizes == [PROBE_SIZE]  # the full size was never built or run


def test_only_the_dtypes_asked_for_are_calibrated():
    rates = measure_rates(torch.device("cpu"), ("float32",), budget_s=0.01, size=64)
    assert set(rates) == {"float32"} and rates["float32"].tflops > 0 and rates["float32"].size == 64

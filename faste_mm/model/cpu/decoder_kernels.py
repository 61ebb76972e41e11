"""The decoder layer's MLP block and its residual, optionally as three oneDNN calls with the
elementwise work inside the matmuls (a profile put the decoder layer's non-GEMM ops at ~25% of its
time on a 2-core AMX CPU):

    gate = swish(x @ W_gate)              (swish post-op: SiLU on the float32 accumulator)
    both = (x @ W_up) * gate              (binary-mul post-op)
    out  = (both @ W_down) + residual     (binary-add post-op)

against transformers' `residual + down(act(gate(x)) * up(x))`. Which is faster depends on the CPU
and the shape, so `DecoderMlp` settles it per shape bucket by a mirrored trial (`kernel_choice`),
cached on disk, overridable with $FASTE_MM_DECODER_MLP.
"""

from __future__ import annotations

import torch
from transformers.activations import SiLUActivation

from faste_mm.model.cpu.kernel_choice import (DECODER_MLP_CHOICES, DECODER_MLP_ENV, KernelTrials, TrialCache,
                                              machine_key, requested_choice)


def is_silu(act_fn) -> bool:
    """Whether an MLP's activation is SiLU (torch's module or transformers' ACT2FN["silu"])."""
    return isinstance(act_fn, (torch.nn.SiLU, SiLUActivation))


def can_fuse_mlp(mlp, x: torch.Tensor) -> bool:
    """Whether `mlp_residual(..., fused=True)` can run: a gated SiLU MLP of plain float32/bfloat16
    linear layers (not int8) on a CPU with oneDNN."""
    # cheapest first: this runs once per decoder layer
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.bfloat16):
        return False
    linears = [getattr(mlp, name, None) for name in ("gate_proj", "up_proj", "down_proj")]
    return (all(type(linear) is torch.nn.Linear and linear.weight.dtype == x.dtype for linear in linears)
            and is_silu(getattr(mlp, "act_fn", None)) and torch.backends.mkldnn.is_available())


def mlp_residual(mlp, x: torch.Tensor, residual: torch.Tensor, fused: bool) -> torch.Tensor:
    """residual + mlp(x) for [..., H] rows; `fused`: the three oneDNN calls of the module docstring."""
    if not fused:
        return residual + mlp(x)
    shape = residual.shape
    rows, rest = x.reshape(-1, shape[-1]).contiguous(), residual.reshape(-1, shape[-1]).contiguous()
    pointwise = torch.ops.mkldnn._linear_pointwise
    gate = pointwise(rows, mlp.gate_proj.weight, mlp.gate_proj.bias, "swish", [], "")
    both = pointwise.binary(rows, gate, mlp.up_proj.weight, mlp.up_proj.bias, "mul")
    return pointwise.binary(both, rest, mlp.down_proj.weight, mlp.down_proj.bias, "add").view(shape)


class DecoderMlp:
    """`residual + mlp(x)` for a model's decoder layers, fused or not as settled per shape bucket."""

    def __init__(self, cpu_flags: frozenset[str], requested: str | None = None,
                 trials: KernelTrials | None = None) -> None:
        """requested: "auto" (default: $FASTE_MM_DECODER_MLP, else "auto") measures; "fused" or
        "separate" forces it. `trials` is injectable for tests."""
        self.trials = trials or KernelTrials(
            "decoder MLP", requested_choice(DECODER_MLP_ENV, DECODER_MLP_CHOICES, "decoder MLP", requested),
            TrialCache(machine_key(cpu_flags)), variable=DECODER_MLP_ENV)

    def __call__(self, mlp, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        if not can_fuse_mlp(mlp, x):
            return residual + mlp(x)
        count = x.numel() // x.shape[-1]
        rows = 1 << max(count - 1, 0).bit_length()
        bucket = (f"cpu {str(x.dtype).removeprefix('torch.')} mlp {mlp.gate_proj.in_features}->"
                  f"{mlp.gate_proj.out_features} silu rows<={rows}")
        return self.trials.run(bucket, lambda name: lambda: mlp_residual(mlp, x, residual, name == "fused"),
                               ("fused", "separate"))

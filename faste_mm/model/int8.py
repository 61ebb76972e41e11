"""int8 weights on a CPU (`--dtype int8`, opt-in): the decoder's and the vision tower's linear
layers multiply in int8 through oneDNN (AMX-INT8 / VNNI kernels): weights quantized once per output
channel, activations per token at each call, int32 accumulation, both scales applied to the
output. Everything else (norms, attention, the FastE controller's rotation, pooling) runs in the
model's other dtype: bfloat16 where the CPU multiplies it natively, float32 otherwise.

    codes_x = round(x * 126 / max|x_row|)          per row, in x's dtype
    y       = (codes_x @ codes_W.T) * scale_W       oneDNN int8 GEMM, scale per output column
    y       = y * max|x_row| / 126 (+ bias)         the row's step, in x's dtype

Why not torch.ao's dynamic int8 linear (the path before): it takes and returns float32, so in a
bfloat16 model every projection paid a cast in and out, and it quantizes the activations per
tensor, so one outlier token sets the step of every other. Measured on a 2-core Xeon with AMX
(docs/cpu.md): oneDNN's int8 GEMM 1.2-1.9x the bfloat16 one on the 2B model's shapes; with a step
per token, all-MiniLM-L6-v2's real weights keep cosine 0.997 to float32, where per tensor gave 0.968.

Receives a loaded model (bfloat16 or float32); replaces its linear layers in place.
"""

from __future__ import annotations

import logging

import torch

from faste_mm.errors import ConfigError

log = logging.getLogger(__name__)

# x86 CPU flags that mean native int8 dot products oneDNN uses (AMX-INT8, AVX512-VNNI, AVX-VNNI)
CPU_INT8_FLAGS = ("amx_int8", "avx512_vnni", "avx_vnni")
# never quantized: the embedding table and the tied output head are lookups/unused, and the tower's
# patch embedding is a convolution
SKIPPED = ("embed_tokens", "lm_head")
# a row's largest magnitude maps to 126, not 127: x * (126 / max) rounded in bfloat16 can exceed its
# exact value by 2^-8, and 127.5 would round to 128, outside int8
STEPS = 126.0
# the smallest max|x_row| divided by: an all-zero row stays zero (126 / 1e-30 is finite in bfloat16)
TINY = 1e-30


def int8_support(device: torch.device, cpu_flags: frozenset[str]) -> str:
    """The CPU feature that makes int8 pay here (e.g. "amx_int8"); ConfigError saying why not
    and what to use instead (CUDA, or a CPU without int8 dot products)."""
    if device.type != "cpu":
        raise ConfigError(f"dtype int8 runs on a CPU only (oneDNN's int8 kernels), not on {device.type}; "
                          f"use bfloat16 on a GPU")
    feature = next((flag for flag in CPU_INT8_FLAGS if flag in cpu_flags), None)
    if feature is None or not torch.backends.mkldnn.is_available():
        raise ConfigError(f"dtype int8 needs an x86 CPU with int8 dot products ({' / '.join(CPU_INT8_FLAGS)}) and "
                          f"torch built with oneDNN; this one has none, where int8 is slower than float32: use dtype auto")
    return feature


class Int8Linear(torch.nn.Module):
    """`linear` with int8 weights (a scale per output channel), its input quantized per row at
    each call (module docstring). Input and output in the caller's dtype (bfloat16 or float32)."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach().float()
        self.weight_scale = weight.abs().amax(1).clamp_min(TINY) / 127
        codes = torch.round(weight / self.weight_scale[:, None]).clamp_(-127, 127).to(torch.int8)
        # oneDNN's blocked layout, made once (the weight in its int8 codes only: half of bfloat16's memory)
        self.packed = torch.ops.onednn.qlinear_prepack(codes, None)
        self.zero_points = torch.zeros(self.out_features, dtype=torch.int64)
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).contiguous()
        peak = rows.abs().amax(-1, keepdim=True).float().clamp_min_(TINY)  # [N, 1]
        codes = (rows * (STEPS / peak).to(rows.dtype)).round_().to(torch.int8)
        out = torch.ops.onednn.qlinear_pointwise(codes, 1.0, 0, self.packed, self.weight_scale, self.zero_points,
                                                 None, 1.0, 0, rows.dtype, "none", [], "")
        step = (peak / STEPS).to(rows.dtype)
        out = out.mul_(step) if self.bias is None else torch.addcmul(self.bias.to(rows.dtype), out, step)
        return out.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, int8"


def quantize_model(model: torch.nn.Module) -> int:
    """Replace the linear layers of `model` (any float dtype) except `SKIPPED` with `Int8Linear`;
    returns how many."""
    count = 0
    for _, child in list(model.named_modules()):
        for child_name, layer in list(child.named_children()):
            if type(layer) is torch.nn.Linear and child_name not in SKIPPED:
                setattr(child, child_name, Int8Linear(layer))
                count += 1
    log.info("int8: %d linear layers quantized (oneDNN, per-token activations)", count)
    return count

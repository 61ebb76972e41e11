"""int8 weights on a CPU (`--dtype int8`, opt-in): the decoder's and the vision tower's linear
layers become torch's dynamically quantized linear layers (int8 weights per output channel,
activations quantized per call, int32 accumulation in oneDNN's AMX-INT8/VNNI kernels or FBGEMM's),
everything else stays float32: norms, attention, the FastE controller and the pooled vectors.

Receives a loaded float32 model; hands back the same model with its linear layers replaced.
Which torch path pays was measured on a 2-core Xeon with AMX (docs/cpu.md): the dynamic
quantized linear under the "onednn" engine beats "x86"/"fbgemm" there and `torch._int_mm`
(no AMX kernel) and weight-only `_weight_int8pack_mm` (dequantizes) lose to bfloat16.
"""

from __future__ import annotations

import logging
import warnings

import torch

from faste_mm.errors import ConfigError

log = logging.getLogger(__name__)

# CPU flags that mean native int8 dot products (Intel AMX-INT8, AVX512-VNNI / AVX-VNNI, ARM dot product)
CPU_INT8_FLAGS = ("amx_int8", "avx512_vnni", "avx_vnni", "asimddp")
# torch quantized engines, best first on a CPU with AMX/VNNI (measured, see the module docstring)
ENGINES = ("onednn", "x86", "fbgemm", "qnnpack")
# never quantized: the embedding table and the tied output head are lookups/unused, and the tower's
# patch embedding is a convolution
SKIPPED = ("embed_tokens", "lm_head")


def int8_support(device: torch.device, cpu_flags: frozenset[str]) -> str:
    """The CPU feature that makes int8 pay here (e.g. "amx_int8"); ConfigError saying why not
    and what to use instead (CUDA, or a CPU without int8 dot products)."""
    if device.type != "cpu":
        raise ConfigError(f"dtype int8 runs on a CPU only (torch's dynamic int8 kernels), not on {device.type}; "
                          f"use bfloat16 on a GPU")
    feature = next((flag for flag in CPU_INT8_FLAGS if flag in cpu_flags), None)
    if feature is None:
        raise ConfigError(f"dtype int8 needs a CPU with int8 dot products ({' / '.join(CPU_INT8_FLAGS)}); this one "
                          f"has none, where int8 is slower than float32: use dtype auto")
    return feature


def engine() -> str:
    """The quantized engine int8 layers are built and run with (the first of `ENGINES` torch has)."""
    supported = torch.backends.quantized.supported_engines
    return next(name for name in ENGINES if name in supported)


def quantize_linear(module: torch.nn.Module) -> torch.nn.Module:
    """Every nn.Linear inside `module` (or `module` itself) -> torch.ao's dynamic int8 linear,
    built for `engine()`. The module must be float32; it is changed in place where it can be
    (children are replaced) and returned."""
    torch.backends.quantized.engine = engine()  # process-wide in torch: the packed weights depend on it
    with warnings.catch_warnings():  # torch.ao's deprecation notice: it stays the one CPU int8 path in torch
        warnings.simplefilter("ignore")
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

        # per output channel: on all-MiniLM-L6-v2's real weights per-tensor scales gave cosine
        # 0.94-0.96 to float32, per-channel 0.97-0.98 (activations are per tensor either way)
        spec = {torch.nn.Linear: per_channel_dynamic_qconfig}
        if isinstance(module, torch.nn.Linear):
            return quantize_dynamic(torch.nn.Sequential(module), spec, dtype=torch.qint8, inplace=True)[0]
        return quantize_dynamic(module, spec, dtype=torch.qint8, inplace=True)


def quantize_model(model: torch.nn.Module) -> int:
    """Quantize the linear layers of `model` (float32) except `SKIPPED`; returns how many."""
    if next(model.parameters()).dtype != torch.float32:
        raise ConfigError("int8 quantization starts from float32 weights; load the model with dtype float32")
    count = 0
    for name, child in list(model.named_modules()):
        for child_name, layer in list(child.named_children()):
            if isinstance(layer, torch.nn.Linear) and child_name not in SKIPPED:
                setattr(child, child_name, quantize_linear(layer))
                count += 1
    log.info("int8: %d linear layers quantized (engine %s)", count, engine())
    return count

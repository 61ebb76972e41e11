"""Unpadded (variable-length) attention for the decoder layers after compression.

FastE's gather leaves rows of different kept lengths; the padded layout keeps spending attention
and MLP work on the padding. Packing the rows into one token stream (`PackedState`) runs every
remaining layer on real tokens only, with one of these variable-length attention kernels:

  flash-attn    `flash_attn_varlen_func` (CUDA, float16/bfloat16, when flash-attn is installed)
  torch-nested  PyTorch jagged nested tensors through scaled_dot_product_attention (CUDA)
  segments      one causal SDPA call per row (any device; slow on GPUs, the portable reference)

`Unpadded` holds the choice ("auto", "off" or a kernel name). "auto" on CUDA runs a trial on the
first compressed batch (`runner.settle_kernel`, before the batch's real forward): the batch once
padded and once per available CUDA kernel (each after a warm-up run), keeps the fastest whose
vectors agree with the padded ones, and records the timings; every later batch uses that choice. "auto" on a CPU is "segments" without a
trial: measured there it matched the padded layers within noise on equal lengths and was up to
18% faster on mixed lengths (docs/benchmarks-log.md): it skips the padding, and CPU SDPA runs faster
causal than masked.
"""

from __future__ import annotations

import importlib.util
import logging
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from faste_mm.model.batching import UNPADDED_MODES
from faste_mm.model.decoder_state import PackedState
from faste_mm.errors import ConfigError

log = logging.getLogger(__name__)

# q [N, A, D_h], k/v [N, A_kv, D_h], the packed rows, softmax scale -> [N, A, D_h]
Kernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, PackedState, float], torch.Tensor]

PADDED = "padded"
AGREEMENT_MIN_COSINE = 0.999  # a trial kernel whose readout vectors differ more is rejected


def attend_segments(q, k, v, packed: PackedState, scale: float) -> torch.Tensor:
    out = torch.empty_like(q)
    start = 0
    for length in packed.lengths:
        rows = slice(start, start + length)
        # [L, A, D_h] -> [1, A, L, D_h]: SDPA's layout; GQA by enable_gqa, no repeated K/V
        q_row, k_row, v_row = (x[rows].transpose(0, 1)[None] for x in (q, k, v))
        attended = F.scaled_dot_product_attention(q_row, k_row, v_row, is_causal=True, scale=scale, enable_gqa=True)
        out[rows] = attended[0].transpose(0, 1)
        start += length
    return out


def attend_flash_attn(q, k, v, packed: PackedState, scale: float) -> torch.Tensor:
    from flash_attn import flash_attn_varlen_func  # GQA natively: k/v keep A_kv heads

    cu_seqlens, longest = packed.cu_seqlens, packed.max_length
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, longest, longest, softmax_scale=scale, causal=True)


def attend_torch_nested(q, k, v, packed: PackedState, scale: float) -> torch.Tensor:
    # one offsets tensor for every layer: no per-layer conversion, and torch keys the jagged
    # dimension by this tensor, so all layers share one instead of registering a new one each
    offsets = packed.offsets
    groups = q.shape[1] // k.shape[1]
    if groups > 1:  # jagged SDPA has no GQA path: repeat K/V heads (A_kv -> A)
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)

    def nest(x: torch.Tensor) -> torch.Tensor:
        # known max_seqlen: without it the kernel would ask the GPU for it (a host sync) every layer
        jagged = torch.nested.nested_tensor_from_jagged(x, offsets, max_seqlen=packed.max_length)
        return jagged.transpose(1, 2)  # [B, A, j, D_h]

    out = F.scaled_dot_product_attention(nest(q), nest(k), nest(v), is_causal=True, scale=scale)
    return out.transpose(1, 2).values()  # [N, A, D_h]


KERNELS: dict[str, Kernel] = {
    "flash-attn": attend_flash_attn,
    "torch-nested": attend_torch_nested,
    "segments": attend_segments,
}
_AUTO_CANDIDATES = ("flash-attn", "torch-nested")  # "segments" loops in Python: never a GPU winner


def kernel_unavailable(name: str, device: torch.device, dtype: torch.dtype) -> str | None:
    """Why kernel `name` cannot run here, or None when it can."""
    if name == "segments":
        return None
    if device.type != "cuda":
        return "needs a CUDA device"
    if name == "flash-attn":
        if dtype not in (torch.float16, torch.bfloat16):
            return f"needs float16 or bfloat16, the model is {str(dtype).removeprefix('torch.')}"
        if importlib.util.find_spec("flash_attn") is None:
            return "flash-attn is not installed (pip install flash-attn --no-build-isolation)"
    return None


@dataclass(frozen=True, slots=True)
class PackedKernel:
    """A variable-length attention kernel the runner hands packed rows to, with its name for traces."""

    name: str
    attend: Kernel


class Unpadded:
    """Which attention the layers after compression use; settles "auto" by a one-time trial.

    `choice` is PADDED or a kernel name once settled (None while "auto" has not seen a batch);
    `trial` maps each tried option to its seconds for the trial batch, or to why it was rejected.
    """

    def __init__(self, mode: str, device: torch.device, dtype: torch.dtype, candidates: dict[str, Kernel] | None = None) -> None:
        """`candidates` replaces the kernels "auto" tries (default: the available CUDA kernels)."""
        if mode not in UNPADDED_MODES:
            raise ConfigError(f"unpadded must be one of {', '.join(UNPADDED_MODES)}; got {mode!r}")
        if mode in KERNELS and (reason := kernel_unavailable(mode, device, dtype)) is not None:
            raise ConfigError(f"unpadded={mode!r} {reason}; use 'auto' or 'off'")
        self.mode = mode
        self.device = device
        self.trial: dict[str, float | str] = {}
        if candidates is None and device.type == "cuda":
            candidates = {n: KERNELS[n] for n in _AUTO_CANDIDATES if kernel_unavailable(n, device, dtype) is None}
        self.candidates = candidates or {}
        self.choice: str | None = None  # settled on the first compressed batch
        if mode == "off":
            self.choice = PADDED
        elif mode in KERNELS:
            self.choice = mode
        elif candidates is None:
            self.choice = "segments"  # "auto" on a CPU (see the module docstring)
        elif not candidates:
            self.choice = PADDED  # "auto" on CUDA without a usable kernel: nothing to try

    def kernel(self, name: str) -> PackedKernel | None:
        """The named option as the runner takes it: None for the padded layers."""
        if name == PADDED:
            return None
        return PackedKernel(name, self.candidates.get(name) or KERNELS[name])

    def settle(self, run: Callable[[PackedKernel | None], torch.Tensor]) -> PackedKernel | None:
        """The chosen kernel, running the trial first if "auto" has none yet.

        `run(kernel)` embeds the trial batch with that kernel after compression (None = padded)
        and returns its [B, H] vectors. Each option runs once to warm up (kernel selection,
        allocator, lazy imports) and once timed; the fastest whose vectors agree with the padded
        ones wins, and the timings stay in `trial`.
        """
        if self.choice is not None:
            return self.kernel(self.choice)
        reference = None
        timings: dict[str, float] = {}
        for name in (PADDED, *self.candidates):
            try:
                run(self.kernel(name))
                elapsed, vectors = self._timed(lambda: run(self.kernel(name)))
            except Exception as error:  # a kernel this GPU or build cannot run is skipped, never fatal
                self.trial[name] = f"failed: {type(error).__name__}: {error}"
                log.warning("unpadded attention %s failed its trial: %s", name, error)
                continue
            if reference is None:
                reference = vectors
            else:
                agreement = float(F.cosine_similarity(vectors.float(), reference.float(), dim=-1).min())
                if agreement < AGREEMENT_MIN_COSINE:
                    self.trial[name] = f"rejected: readout cosine to padded {agreement:.5f} < {AGREEMENT_MIN_COSINE}"
                    log.warning("unpadded attention %s disagrees with the padded layers (cosine %.5f)", name, agreement)
                    continue
            self.trial[name] = elapsed
            timings[name] = elapsed
        self.choice = min(timings, key=timings.get) if timings else PADDED
        log.debug("attention after compression: %s (trial seconds: %s)", self.choice, self.trial)
        return self.kernel(self.choice)

    def _timed(self, run: Callable[[], torch.Tensor]) -> tuple[float, torch.Tensor]:
        self._synchronize()
        started = time.perf_counter()
        out = run()
        self._synchronize()
        return time.perf_counter() - started, out

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

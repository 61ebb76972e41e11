"""int8 weights on a CPU (`--dtype int8`, opt-in): the decoder's and the vision tower's linear
layers multiply in int8 through oneDNN (AMX-INT8 / VNNI kernels): weights quantized once per output
channel, activations per token at each call, int32 accumulation, both scales applied to the
output. Everything else (norms, attention, the FastE controller's rotation, pooling) runs in the
model's other dtype: bfloat16 where the CPU multiplies it natively, float32 otherwise.

    codes_x = round(x * 126 / max|x_row|)          per row, in x's dtype
    y       = (codes_x @ codes_W.T) * scale_W       oneDNN int8 GEMM, scale per output column
    y       = y * max|x_row| / 126 (+ bias)         the row's step, in x's dtype

The activation codes reach oneDNN as uint8 with a zero point of 128 ("u8": codes_x + 128, in
[2, 254]; oneDNN subtracts the 128 in its int32 sums, so the output is bit-identical) or as int8
("s8"). u8 x s8 is the operand form of the x86 int8 dot-product instructions (VNNI's vpdpbusd,
AMX's tdpbusd): on a 2-core AMD EPYC with avx512_vnni, oneDNN ran s8 activations through a
reference kernel at 0.01 GFLOP/s and u8 ones at ~80 GFLOP/s, 1.9x its bfloat16 linear. The trial
measures both and keeps the faster (`Int8Trial.codes`).

Why not torch.ao's dynamic int8 linear (the path before): it takes and returns float32, so in a
bfloat16 model every projection paid a cast in and out, and it quantizes the activations per
tensor, so one outlier token sets the step of every other. Measured on a 2-core Xeon with AMX
(docs/cpu.md): oneDNN's int8 GEMM 1.2-1.9x the bfloat16 one on the 2B model's shapes; with a step
per token, all-MiniLM-L6-v2's real weights keep cosine 0.997 to float32, where per tensor gave 0.968.

Whether int8 pays is measured, not read off the flags: the same flags can hide a kernel that does
not use them (the s8 activations above, 2,000x slower than bfloat16 on that AMD EPYC). `int8_trial` times this module against the rest dtype's linear layer on this
CPU, a small probe first so that a slow kernel is caught in a fraction of a second, and `choose_dtype`
accepts `--dtype int8` only when the trial says it is faster; the verdict is cached like the other
kernel choices (by CPU model, flags and torch version).

Receives a loaded model (bfloat16 or float32); replaces its linear layers in place.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

import torch

from faste_mm.errors import ConfigError
from faste_mm.model.cpu.kernel_choice import TrialCache, fastest, machine_key, requested_choice, timed

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
# how activation codes reach oneDNN (module docstring): uint8 shifted by ZERO_POINT, or int8
ACTIVATION_CODES = ("u8", "s8")
ZERO_POINT = 128
# "auto" runs the trial; "skip" takes int8 without it (you measured it yourself, or test the layer's
# numbers on a CPU where it is slow)
INT8_TRIAL_ENV = "FASTE_MM_INT8_TRIAL"
INT8_TRIAL_CHOICES = ("auto", "skip")
# (rows, in, out): the probe is small enough that even a reference kernel answers in ~0.1 s; the
# judged shape is a 2B decoder projection over a photo's ~320 rows
PROBE_SHAPE = (32, 256, 256)
TRIAL_SHAPE = (320, 2048, 2048)
# int8 must beat the rest dtype's layer by 10%: the forward around the layers is unchanged, and the
# tower's linear+GELU loses the fused post-op bfloat16 gets
MARGIN = 0.9
# the probe stops the trial when int8 at the judged shape would take longer than this per call
PROBE_LIMIT_S = 1.0


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


@dataclass(frozen=True, slots=True)
class Int8Trial:
    """The verdict on int8 here: the layer's seconds in int8 and in the rest dtype at `shape`
    (rows, in, out), and how it was settled ("measured", "cached" from an earlier run on this CPU
    and torch, "asked" by FASTE_MM_INT8_TRIAL=skip)."""

    accepted: bool
    int8_s: float
    rest_s: float
    rest: str  # "bfloat16" or "float32"
    shape: tuple[int, int, int]
    how: str
    codes: str = "u8"  # the activation codes measured faster (`ACTIVATION_CODES`)

    @property
    def speedup(self) -> float:
        """int8's speed as a multiple of the rest dtype's (above 1: int8 faster)."""
        return self.rest_s / self.int8_s if self.int8_s > 0 else 0.0

    def describe(self) -> str:
        """E.g. "int8 linear 0.0005x bfloat16 at 32x256x256 (62 ms vs 0.031 ms), measured on this CPU"."""
        if self.how == "asked":
            return f"int8 linear taken without a trial ({INT8_TRIAL_ENV}=skip)"
        when = "measured" if self.how == "measured" else "measured earlier (cached)"
        rows, k, n = self.shape
        return (f"int8 linear ({self.codes} activations) {self.speedup:.2g}x {self.rest} at {rows}x{k}x{n} "
                f"({self.int8_s * 1e3:.3g} ms vs {self.rest_s * 1e3:.3g} ms), {when} on this CPU")

    def to_dict(self) -> dict:
        return {**asdict(self), "speedup": self.speedup, "text": self.describe()}


def int8_trial(rest: torch.dtype, cpu_flags: frozenset[str], cache: TrialCache | None = None, timer=timed) -> Int8Trial:
    """Time `Int8Linear`, with each of `ACTIVATION_CODES`, against `rest`'s linear layer on this
    CPU: the probe shape first (an encoding whose time at `TRIAL_SHAPE` would pass `PROBE_LIMIT_S`
    goes no further; none left stops the trial), then `TRIAL_SHAPE`, each mirrored
    (`kernel_choice.fastest`). Accepted when int8's faster encoding takes at most `MARGIN` of the
    rest dtype's time.
    The verdict is cached (`cache`, default this machine's kernel cache); $FASTE_MM_INT8_TRIAL=skip
    accepts without measuring. `timer(run)` -> (seconds, result) times each call (warm-ups too)."""
    rest_name = str(rest).removeprefix("torch.")
    if requested_choice(INT8_TRIAL_ENV, INT8_TRIAL_CHOICES, "int8 trial") == "skip":
        return Int8Trial(True, 0.0, 0.0, rest_name, TRIAL_SHAPE, "asked")
    cache = cache if cache is not None else TrialCache(machine_key(cpu_flags))
    bucket = trial_bucket(rest_name)
    record = cache.get(bucket)
    if record is not None and isinstance(record.get("verdict"), dict):
        return Int8Trial(**{**record["verdict"], "shape": tuple(record["verdict"]["shape"]), "how": "cached"})
    verdict, seconds = _measured(rest, PROBE_SHAPE, timer, ACTIVATION_CODES)
    scale = _flops(TRIAL_SHAPE) / _flops(PROBE_SHAPE)
    going_on = tuple(codes for codes in ACTIVATION_CODES
                     if seconds[codes] <= verdict.rest_s / MARGIN or seconds[codes] * scale <= PROBE_LIMIT_S)
    if going_on:
        verdict, _ = _measured(rest, TRIAL_SHAPE, timer, going_on)
    cache.put(bucket, "int8" if verdict.accepted else rest_name, {"int8": verdict.int8_s, rest_name: verdict.rest_s},
              verdict={k: v for k, v in asdict(verdict).items() if k != "how"})
    log.debug("%s", verdict.describe())
    return verdict


def trial_bucket(rest_name: str) -> str:
    """The kernel cache's key for the verdict against `rest_name` ("bfloat16" or "float32")."""
    return f"cpu int8 linear (u8|s8 activations) vs {rest_name} {'x'.join(map(str, TRIAL_SHAPE))}"


def _flops(shape: tuple[int, int, int]) -> int:
    rows, k, n = shape
    return rows * k * n


@torch.inference_mode()
def _measured(rest: torch.dtype, shape: tuple[int, int, int], timer,
              encodings: tuple[str, ...]) -> tuple[Int8Trial, dict[str, float]]:
    """The verdict at `shape` for int8's fastest of `encodings`, and each candidate's seconds."""
    rows, k, n = shape
    generator = torch.Generator().manual_seed(0)
    linear = torch.nn.Linear(k, n, bias=False)
    torch.nn.init.normal_(linear.weight, std=k**-0.5, generator=generator)
    x = torch.randn(rows, k, generator=generator).to(rest)

    def call(layer: torch.nn.Module):
        return lambda: layer(x)

    candidates = {codes: call(Int8Linear(linear, codes)) for codes in encodings}
    candidates["rest"] = call(linear.to(rest))
    for run in candidates.values():  # warm-up: oneDNN's kernel selection and packing
        timer(run)
    _, seconds, _ = fastest(candidates, timer)
    codes = min(encodings, key=lambda name: seconds[name])
    verdict = Int8Trial(seconds[codes] <= MARGIN * seconds["rest"], seconds[codes], seconds["rest"],
                        str(rest).removeprefix("torch."), shape, "measured", codes)
    return verdict, seconds


class Int8Linear(torch.nn.Module):
    """`linear` with int8 weights (a scale per output channel), its input quantized per row at
    each call (module docstring). Input and output in the caller's dtype (bfloat16 or float32)."""

    def __init__(self, linear: torch.nn.Linear, codes: str = "u8") -> None:
        super().__init__()
        if codes not in ACTIVATION_CODES:
            raise ValueError(f"codes must be one of {ACTIVATION_CODES}, got {codes!r}")
        self.codes = codes
        # u8: the codes shifted by ZERO_POINT into uint8, which oneDNN subtracts again in int32
        self.zero_point, self.code_dtype = (ZERO_POINT, torch.uint8) if codes == "u8" else (0, torch.int8)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach().float()
        self.weight_scale = weight.abs().amax(1).clamp_min(TINY) / 127
        weight_codes = torch.round(weight / self.weight_scale[:, None]).clamp_(-127, 127).to(torch.int8)
        # oneDNN's blocked layout, made once (the weight in its int8 codes only: half of bfloat16's memory)
        self.packed = torch.ops.onednn.qlinear_prepack(weight_codes, None)
        self.zero_points = torch.zeros(self.out_features, dtype=torch.int64)
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).contiguous()
        peak = rows.abs().amax(-1, keepdim=True).float().clamp_min_(TINY)  # [N, 1]
        codes = (rows * (STEPS / peak).to(rows.dtype)).round_()
        if self.zero_point:
            codes.add_(self.zero_point)  # exact in bfloat16 too: integers up to 256 are
        codes = codes.to(self.code_dtype)
        out = torch.ops.onednn.qlinear_pointwise(codes, 1.0, self.zero_point, self.packed, self.weight_scale,
                                                 self.zero_points,
                                                 None, 1.0, 0, rows.dtype, "none", [], "")
        step = (peak / STEPS).to(rows.dtype)
        out = out.mul_(step) if self.bias is None else torch.addcmul(self.bias.to(rows.dtype), out, step)
        return out.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"int8 ({self.codes} activations)")


def quantize_model(model: torch.nn.Module, codes: str = "u8") -> int:
    """Replace the linear layers of `model` (any float dtype) except `SKIPPED` with `Int8Linear`
    (activations coded as `codes`: `Int8Trial.codes` where a trial ran); returns how many."""
    count = 0
    for _, child in list(model.named_modules()):
        for child_name, layer in list(child.named_children()):
            if type(layer) is torch.nn.Linear and child_name not in SKIPPED:
                setattr(child, child_name, Int8Linear(layer, codes))
                count += 1
    log.info("int8: %d linear layers quantized (oneDNN, per-token %s activations)", count, codes)
    return count

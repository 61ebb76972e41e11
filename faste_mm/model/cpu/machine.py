"""The machine a model runs on, described without loading torch: the CPU's feature flags
(/proc/cpuinfo; `choose_dtype` picks bfloat16 on them) and a device's name. Every benchmark result
records both beside its figures (faste_mm.bench.schema); `faste-mm plan` names the device too."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

from faste_mm.model.cpu.machine_plan import BATCH_TOKENS

# How a device, a dtype, a batch's token budget and the layers' layout after FastE compression are
# asked for, in the words of every front end that takes them (the CLI's --device / --dtype /
# --batch-tokens / --unpadded, every `faste-mm bench` suite); the default of each is "auto" (by device).
DEVICE_CHOICES = "auto (CUDA when available) | cpu | cuda | cuda:N"
DTYPE_CHOICES = ("auto (bfloat16 on CUDA and on CPUs with native bf16, else float32) | float32 | bfloat16 | float16 | "
                 "int8 (x86 CPU with VNNI/AMX only: int8 linear layers, the rest bfloat16 where the CPU has it, else "
                 "float32; see docs/cpu.md)")
BATCH_TOKENS_DEFAULT = (f"Default by device: {BATCH_TOKENS['cpu']} on a CPU (smaller batches stay in its caches), "
                        f"{BATCH_TOKENS['cuda']} on a GPU")
UNPADDED_CHOICES = ("auto (CUDA: fastest of padded / flash-attn / torch-nested on a trial batch; CPU: segments) | off | "
                    "flash-attn | torch-nested | segments")


def read_cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo ("flags" on x86, "Features" on ARM); empty
    where there is no such file (macOS, Windows): bfloat16 is then never chosen by "auto"."""
    if not sys.platform.startswith("linux"):
        return frozenset()
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def read_cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name ("AMD EPYC 9454", "Intel(R) Xeon(R) Platinum 8488C"), else the
    platform's processor string: two CPUs with the same flags can still differ in kernel speed
    (oneDNN's int8 GEMM on an AMD EPYC with avx512_vnni ran 2,000x slower than on a Xeon)."""
    try:
        text = cpuinfo.read_text(errors="replace") if sys.platform.startswith("linux") else ""
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "CPU part"):
            return value.strip()
    return platform.processor() or platform.machine()


def device_name(device) -> str:
    """A torch device in words: the GPU's name, or the CPU's architecture, cores and torch threads."""
    import torch  # a device was made with torch: it is loaded already

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU {platform.processor() or platform.machine()} x{os.cpu_count()} (torch threads {torch.get_num_threads()})"

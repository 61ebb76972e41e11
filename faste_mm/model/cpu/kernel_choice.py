"""Kernel choices that depend on the CPU, settled by measurement instead of a fixed rule: the first
time a choice is needed for a device and shape bucket, each candidate runs twice (mirrored) on the real
tensors and the fastest wins; the verdict is cached on disk keyed by the CPU's flags, torch's
version and the trial method (a verdict measured otherwise is ignored), so later runs do not repeat the trial.

Used by the vision tower (`vision_tower.PackedVisionTower`) for the dtype its attention runs in (on
a CPU without native bfloat16 float32 attention wins, on one with AMX bfloat16 wins by 2-5x) and
for whether its MLPs' GELU runs inside oneDNN's linear call as a post-op or after it; by the
decoder (`decoder_kernels`) for whether its MLP's SiLU, product and residual do.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from faste_mm.errors import ConfigError
from faste_mm.model.cpu.machine import read_cpu_model

log = logging.getLogger(__name__)

# The one declaration of each override: "auto" measures, a candidate's name forces it.
TOWER_ATTENTION_DTYPE_ENV = "FASTE_MM_TOWER_ATTENTION_DTYPE"
TOWER_ATTENTION_DTYPES = ("auto", "float32", "bfloat16")
# the tower MLPs' first linear layer and its GELU: one oneDNN call with GELU as a post-op ("fused"),
# or the linear layer and torch's GELU one after the other ("separate")
TOWER_GELU_ENV = "FASTE_MM_TOWER_GELU"
TOWER_GELU_CHOICES = ("auto", "fused", "separate")
# the decoder layers' gated MLP and residual: three oneDNN calls with SiLU, the up*gate product and
# the residual add as post-ops ("fused"), or transformers' modules ("separate")
DECODER_MLP_ENV = "FASTE_MM_DECODER_MLP"
DECODER_MLP_CHOICES = ("auto", "fused", "separate")
TRIAL_CACHE_ENV = "FASTE_MM_KERNEL_CACHE"  # a file path; "off" keeps verdicts in memory only
# Each candidate runs twice, A B then B A: on a shared machine one run each let a burst of
# another process's work decide a verdict that is then cached for good (the tower's merger GELU
# was once "measured 3.8x" slower fused at load 20, and faster fused at load 10).
TRIAL_ROUNDS = 2


def requested_choice(variable: str, valid: tuple[str, ...], what: str, value: str | None = None) -> str:
    """The choice asked for: `value`, else $`variable`, else "auto"; ConfigError naming the
    variable (or `what`, for a given value) and the valid values otherwise."""
    source = what if value is not None else variable
    value = value if value is not None else os.environ.get(variable, "auto")
    if value not in valid:
        raise ConfigError(f"{source} must be one of {', '.join(valid)}, got {value!r}")
    return value


def requested_attention_dtype(value: str | None = None) -> str:
    """The tower attention dtype asked for: `value`, else $FASTE_MM_TOWER_ATTENTION_DTYPE, else "auto"."""
    return requested_choice(TOWER_ATTENTION_DTYPE_ENV, TOWER_ATTENTION_DTYPES, "tower attention dtype", value)


def requested_gelu(value: str | None = None) -> str:
    """The tower MLPs' linear+GELU asked for: `value`, else $FASTE_MM_TOWER_GELU, else "auto"."""
    return requested_choice(TOWER_GELU_ENV, TOWER_GELU_CHOICES, "tower GELU", value)


@dataclass(frozen=True, slots=True)
class KernelChoice:
    """One settled choice: which candidate, how it was settled ("measured" now, "cached" from an
    earlier run on this CPU and torch, "asked" by the override, "rule" where no trial applies),
    and the trial's seconds per candidate (empty unless measured or cached)."""

    kernel: str  # e.g. "tower attention"
    choice: str  # e.g. "bfloat16"
    how: str
    bucket: str = ""
    seconds: dict[str, float] = field(default_factory=dict)
    variable: str = TOWER_ATTENTION_DTYPE_ENV  # the override that asks for a choice

    @property
    def speedup(self) -> float | None:
        """The slowest candidate's seconds over the chosen one's (None without a trial)."""
        if len(self.seconds) < 2 or self.choice not in self.seconds:
            return None
        return max(self.seconds.values()) / max(self.seconds[self.choice], 1e-12)

    def describe(self) -> str:
        """E.g. "tower attention: bfloat16, measured 2.6x float32 on this CPU"."""
        if self.how == "asked":
            return f"{self.kernel}: {self.choice}, asked for ({self.variable})"
        if self.how == "rule" or self.speedup is None:
            return f"{self.kernel}: {self.choice} ({self.how})"
        slowest = max(self.seconds, key=self.seconds.get)
        when = "measured" if self.how == "measured" else "measured earlier (cached)"
        if slowest == self.choice:
            return f"{self.kernel}: {self.choice}, {when}: all candidates equal on this CPU"
        return f"{self.kernel}: {self.choice}, {when} {self.speedup:.1f}x {slowest} on this CPU ({self.bucket})"

    def to_dict(self) -> dict:
        return {**asdict(self), "speedup": self.speedup, "text": self.describe()}


# How verdicts are measured; a verdict measured another way is measured again. "mirrored-2": each
# candidate timed twice, A B then B A (one run let a load burst decide a verdict that then stayed).
TRIAL_METHOD = "mirrored-2"


def machine_key(cpu_flags: frozenset[str], torch_version: str = torch.__version__, cpu_model: str | None = None) -> str:
    """What a cached verdict is valid for: the CPU's model and flags, torch's version (and with it
    oneDNN's) and the trial method (a new CPU, a new torch with other kernels or a better trial
    measures again). `cpu_model` None: this machine's (`read_cpu_model`)."""
    model = read_cpu_model() if cpu_model is None else cpu_model
    digest = hashlib.sha256((model + "|" + " ".join(sorted(cpu_flags))).encode()).hexdigest()[:16]
    return f"cpu:{digest} torch:{torch_version} trial:{TRIAL_METHOD}"


def default_cache_path() -> Path | None:
    """$FASTE_MM_KERNEL_CACHE ("off": none), else user_cache_dir("faste-mm")/kernel_choices.json."""
    value = os.environ.get(TRIAL_CACHE_ENV)
    if value == "off":
        return None
    if value:
        return Path(value)
    import platformdirs

    return Path(platformdirs.user_cache_dir("faste-mm")) / "kernel_choices.json"


class TrialCache:
    """Verdicts on disk: {"machine": machine_key, "entries": {bucket: {"choice", "seconds"}}}.
    A file written for another machine key is ignored (and replaced on the next write); an
    unreadable file is ignored with a log line, never an error: the trial simply runs again.
    `path` None: `default_cache_path()`, looked up on each use (the environment may change)."""

    def __init__(self, machine: str, path: Path | None = None) -> None:
        self._path = path
        self.machine = machine

    @property
    def path(self) -> Path | None:
        return self._path if self._path is not None else default_cache_path()

    def get(self, bucket: str) -> dict | None:
        return self._entries().get(bucket)

    def put(self, bucket: str, choice: str, seconds: dict[str, float], **extra) -> None:
        """Record `bucket`'s verdict (`extra`: more of it, e.g. the int8 trial's whole record)."""
        path = self.path
        if path is None:
            return
        entries = {**self._entries(), bucket: {"choice": choice, "seconds": seconds, **extra}}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            temporary = path.with_name(path.name + f".{os.getpid()}.tmp")
            temporary.write_text(json.dumps({"machine": self.machine, "entries": entries}, indent=1))
            temporary.replace(path)  # atomic: a concurrent reader sees the old file or the new
        except OSError as error:
            log.warning("kernel choices not cached in %s (%s); the trial will run again next time", path, error)

    def _entries(self) -> dict:
        path = self.path
        if path is None or not path.is_file():
            return {}
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            log.warning("ignoring unreadable kernel cache %s (%s)", path, error)
            return {}
        if not isinstance(data, dict) or data.get("machine") != self.machine:
            return {}  # measured on another CPU or torch: not valid here
        entries = data.get("entries")
        return entries if isinstance(entries, dict) else {}


def timed(run: Callable[[], torch.Tensor]) -> tuple[float, torch.Tensor]:
    """(seconds, result) of one call (CUDA work is waited for)."""
    started = time.perf_counter()
    result = run()
    if result.device.type == "cuda":
        torch.cuda.synchronize(result.device)
    return time.perf_counter() - started, result


def fastest(candidates: dict[str, Callable[[], torch.Tensor]], timer=timed,
            rounds: int = TRIAL_ROUNDS) -> tuple[str, dict[str, float], torch.Tensor]:
    """Run each candidate `rounds` times, the order mirrored every other round (`timer(run)` ->
    (seconds, result)); (the fastest's name, its best seconds per candidate, the fastest's
    result). Ties go to the first candidate."""
    seconds: dict[str, float] = {}
    results: dict[str, torch.Tensor] = {}
    names = list(candidates)
    for round_index in range(rounds):
        for name in names if round_index % 2 == 0 else names[::-1]:
            elapsed, results[name] = timer(candidates[name])
            seconds[name] = min(elapsed, seconds.get(name, elapsed))
    best = min(names, key=lambda name: seconds[name])
    return best, {name: seconds[name] for name in names}, results[best]


class KernelTrials:
    """The choices of one model on one device, settled per shape bucket: from the override, else
    the in-memory verdict, else the disk cache, else a trial on the caller's real inputs (whose
    winning result is returned, so the trial costs the losing candidates' runs and one more of the winner's)."""

    def __init__(self, kernel: str, requested: str, cache: TrialCache | None, timer=timed,
                 variable: str = TOWER_ATTENTION_DTYPE_ENV) -> None:
        self.kernel = kernel
        self.requested = requested
        self.cache = cache
        self.timer = timer
        self.variable = variable  # the override's name, for the verdict's words
        self.choices: dict[str, KernelChoice] = {}
        self.related: list[KernelTrials] = []  # other kernels of the same model, described with these

    def settled(self, bucket: str) -> KernelChoice | None:
        """The choice for `bucket` without running anything, when it is already known."""
        if self.requested != "auto":
            return self.choices.setdefault(bucket, KernelChoice(self.kernel, self.requested, "asked", bucket,
                                                                             variable=self.variable))
        if bucket in self.choices:
            return self.choices[bucket]
        record = self.cache.get(bucket) if self.cache is not None else None
        if record is not None and isinstance(record.get("choice"), str):
            choice = KernelChoice(self.kernel, record["choice"], "cached", bucket, dict(record.get("seconds") or {}),
                                  self.variable)
            self.choices[bucket] = choice
            log.debug("%s", choice.describe())
            return choice
        return None

    def trial(self, bucket: str, candidates: dict[str, Callable[[], torch.Tensor]]) -> tuple[KernelChoice, torch.Tensor]:
        """Time each candidate on the real inputs (`fastest`); record and cache the winner."""
        best, seconds, result = fastest(candidates, self.timer)
        choice = KernelChoice(self.kernel, best, "measured", bucket, seconds, self.variable)
        self.choices[bucket] = choice
        if self.cache is not None:
            self.cache.put(bucket, best, seconds)
        log.debug("%s", choice.describe())
        return choice, result

    def run(self, bucket: str, make: Callable[[str], Callable[[], torch.Tensor]],
            names: tuple[str, ...]) -> torch.Tensor:
        """The result of `make(choice)()` for `bucket`'s settled choice, else of the trial's winner."""
        if (settled := self.settled(bucket)) is not None:
            return make(settled.choice)()
        return self.trial(bucket, {name: make(name) for name in names})[1]

    def describe(self) -> list[str]:
        """These verdicts in words, then those of the `related` kernels."""
        return [choice.describe() for choice in self.choices.values()] + [line for other in self.related for line in other.describe()]

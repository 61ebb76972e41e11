"""Threads and batches for the machine: how many CPUs this process may use, and from that count
torch's intra-op and inter-op threads, the preprocessing threads and the padded-token budget of a
batch. One plan (`machine_plan`) that the embedder, the reranker, the prefetch pool
(`BatchingConfig.for_device`) and the bench lines read, so the 2-core VM and the 16-core
workstation each get their own numbers from one place.

The core count is what the process may really run on: its affinity mask (`taskset`, a cpuset),
lowered to the cgroup's CPU quota where one is set (a container given 2 CPUs of a 64-core host
gets 2, where `os.cpu_count()` and torch's own default say 64). Explicit settings win over the
machine's rule: `BatchingConfig.workers` (bench `--workers`), `BatchingConfig.batch_tokens`
(`--batch-tokens`) and the user's OMP_NUM_THREADS / MKL_NUM_THREADS (which torch read at start).

Why each value (`faste-mm bench threads` measures the plan against each value changed, side by
side; the runs so far are in docs/performance.md "Threads and batches for the machine"):
- intra-op threads = cores: what torch itself picks on an idle machine, now counted from the
  usable cores; on a machine loaded past its cores fewer threads can win (docs/cpu.md "Threads"),
  which OMP_NUM_THREADS sets;
- inter-op threads = 1: nothing in faste-mm forks torch work onto the inter-op pool (no
  torch.jit.fork), so its threads would only sit idle;
- preprocessing threads = cores (at most 8): a worker decodes, resizes and tokenizes the next
  batch while the model runs, and PIL, the image processor and the tokenizers release the GIL;
- batch tokens: `BATCH_TOKENS` by device.
"""

from __future__ import annotations

import math
import os
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Collection, Iterator, Mapping

from faste_mm.errors import ConfigError

# Padded tokens per batch when BatchingConfig.batch_tokens is None, by device type. A CPU runs a
# layer faster per token in smaller batches (its activations stay in cache): 4,096-token batches
# embedded 1,000-token texts 1.09x faster than 16,384 (2B shape x0.125), a real-width 2B layer ran
# 1.1x faster per token in bfloat16, photos within 3% (docs/benchmarks-log.md, round 5 of
# "Reranking"); a GPU wants the large batches.
BATCH_TOKENS = {"cpu": 4096, "cuda": 16384}
MAX_PREP_THREADS = 8  # preprocessing threads past this wait on the model, not on the inputs
INTEROP_THREADS = 1  # no torch.jit.fork anywhere: the inter-op pool only holds idle threads
# The FastE alignment check runs its few memory-bound reductions on one thread on a CPU
# (model/faste.py batch_alignment: 3.4-18x faster than all threads on a loaded 2-core machine)
CHECK_THREADS = 1
CGROUP_ROOT = Path("/sys/fs/cgroup")
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")  # the user's torch threads, read by torch at start


@dataclass(frozen=True, slots=True)
class MachinePlan:
    """What a model run uses on this machine: `cores` CPUs (found from `cores_from`), torch's
    intra-op and inter-op threads, preprocessing threads (0 = in the model's thread) and the
    padded tokens of a batch; `chosen` names the values the user set (they won over the rule)."""

    cores: int
    cores_from: str
    device: str
    intra_op_threads: int
    interop_threads: int
    prep_threads: int
    batch_tokens: int
    chosen: tuple[str, ...] = ()

    def describe(self) -> str:
        """One line for the run's report: "threads: torch 2, inter-op 1, preprocessing 2, batch
        tokens 4096 (2 cores: affinity)"."""
        chosen = f"; set: {', '.join(self.chosen)}" if self.chosen else ""
        return (f"threads: torch {self.intra_op_threads}, inter-op {self.interop_threads}, preprocessing "
                f"{self.prep_threads}, batch tokens {self.batch_tokens} ({self.cores} cores: {self.cores_from}{chosen})")

    def to_dict(self) -> dict:
        return {**asdict(self), "chosen": list(self.chosen)}


def machine_plan(cores: int | None = None, device: str = "cpu", *, workers: int | None = None,
                 batch_tokens: int | None = None, env: Mapping[str, str] | None = None,
                 cgroup: Path = CGROUP_ROOT) -> MachinePlan:
    """The plan for `device` ("cpu" or "cuda") on `cores` CPUs (None: `available_cores`).

    workers / batch_tokens: the user's preprocessing threads and batch budget (None: the rule's);
    env: where the user's OMP_NUM_THREADS / MKL_NUM_THREADS are read (None: os.environ).
    Raises ConfigError for cores < 1 or a thread variable that is not a positive integer."""
    if cores is None:
        cores, cores_from = available_cores(cgroup=cgroup)
    else:
        cores_from = "given"
    if not isinstance(cores, int) or cores < 1:
        raise ConfigError(f"machine_plan: cores must be an int >= 1, got {cores!r}")
    kind = device if device in BATCH_TOKENS else "cpu"
    chosen = []
    threads = _env_threads(os.environ if env is None else env)
    if threads is not None:
        chosen.append(f"{threads[0]}={threads[1]}")
    if workers is not None:
        chosen.append(f"workers={workers}")
    if batch_tokens is not None:
        chosen.append(f"batch_tokens={batch_tokens}")
    return MachinePlan(
        cores=cores,
        cores_from=cores_from,
        device=kind,
        intra_op_threads=cores if threads is None else threads[1],
        interop_threads=INTEROP_THREADS,
        prep_threads=min(MAX_PREP_THREADS, cores) if workers is None else workers,
        batch_tokens=BATCH_TOKENS[kind] if batch_tokens is None else batch_tokens,
        chosen=tuple(chosen),
    )


def available_cores(affinity: Collection[int] | None = None, cgroup: Path = CGROUP_ROOT) -> tuple[int, str]:
    """(CPUs this process may run on, where that number came from): the affinity mask
    (`affinity`, None: os.sched_getaffinity), lowered to the cgroup's CPU quota rounded up
    (cgroup v2 `cpu.max`, v1 `cpu/cpu.cfs_quota_us` over `cpu.cfs_period_us`) where it is set."""
    if affinity is None:
        affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    cores, source = max(1, len(affinity)), "affinity"
    quota = cgroup_quota(cgroup)
    if quota is not None and math.ceil(quota) < cores:
        cores, source = max(1, math.ceil(quota)), f"cgroup quota {quota:g} CPUs of {cores}"
    return cores, source


def cgroup_quota(root: Path = CGROUP_ROOT) -> float | None:
    """The CPUs a cgroup's quota allows (e.g. 2.0 for "200000 100000"), None where none is set
    or no file can be read (not Linux, no cgroup mounted)."""
    for quota_file, period_file in ((root / "cpu.max", None),
                                    (root / "cpu" / "cpu.cfs_quota_us", root / "cpu" / "cpu.cfs_period_us")):
        try:
            text = quota_file.read_text().split()
            if period_file is not None:
                text = [*text[:1], *period_file.read_text().split()[:1]]
        except OSError:
            continue
        if len(text) < 2 or text[0] in ("max", "-1"):
            return None
        try:
            quota, period = float(text[0]), float(text[1])
        except ValueError:
            return None
        return quota / period if quota > 0 and period > 0 else None
    return None


@contextmanager
def check_threads(device: "torch.device") -> Iterator[None]:
    """Run FastE's alignment check (`faste.batch_alignment`) on `CHECK_THREADS` on a CPU: its few
    memory-bound reductions gain nothing from a second thread, and each parallel op waits for every
    pool thread to be scheduled (single-threaded 3.4-18x faster on a loaded 2-core machine,
    docs/cpu.md "Threads"). Not process-wide for torch's own ops: with its OpenMP backend a thread
    that has run torch keeps its own count (other serve threads are untouched), though MKL's count
    and a thread's first torch op meet 1 meanwhile. Elsewhere (CUDA) nothing changes."""
    if device.type != "cpu":
        yield
        return
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(CHECK_THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def use_torch_threads(plan: MachinePlan) -> int:
    """Bring torch's intra-op threads to the plan's where torch runs more (its default counts
    the host's cores, not the cgroup's quota; a user's OMP_NUM_THREADS is the plan's already),
    never raising a count the caller lowered (a Ray actor's share, a bench's --threads); the
    inter-op pool to the plan's while it has not started. Returns torch's intra-op threads."""
    import torch

    if torch.get_num_threads() > plan.intra_op_threads or any(c.split("=")[0] in THREAD_ENV for c in plan.chosen):
        torch.set_num_threads(plan.intra_op_threads)
    if torch.get_num_interop_threads() != plan.interop_threads:
        try:
            torch.set_num_interop_threads(plan.interop_threads)
        except RuntimeError:  # the pool has started (torch allows setting it once, before any use): keep it
            pass
    return torch.get_num_threads()


def _env_threads(env: Mapping[str, str]) -> tuple[str, int] | None:
    """(variable, count) of the first thread variable the user set, None where none is."""
    for name in THREAD_ENV:
        value = env.get(name, "").strip().split(",")[0]  # "4,2": OpenMP's nested levels, the first is torch's
        if not value:
            continue
        if not value.isdigit() or int(value) < 1:
            raise ConfigError(f"{name}={value!r}: torch threads must be a positive integer; "
                              f"set {name} to e.g. 2, or unset it to use one per core")
        return name, int(value)
    return None

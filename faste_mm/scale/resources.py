"""What an `index --ray` run reserves on its cluster, and how it notices that it is stuck.

The pipeline has two stages that both need CPU: decoding tasks and the embedding actors. Ray Data
gives each stage a share of the cluster; when the actors reserve every CPU, the decoding stage's
share is 0 and the run waits forever with nothing committed. `plan_resources` makes every plan
leave decoding some CPU (a fractional share if that is all there is, fewer actors when the actor
count was not asked for) and refuses, saying what to change, a request that cannot run.
`StallWatch` says on stderr (a log warning) what waits for what when no result has come back for
a while and Ray's free resources cannot start the waiting work. No Ray import here: the cluster is
passed in as Ray's resource dictionaries.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator, Mapping

from faste_mm.errors import ConfigError

if TYPE_CHECKING:
    from faste_mm.scale.options import RayOptions

log = logging.getLogger(__name__)

STALL_AFTER_S = 120.0  # no result back for this long, with work waiting for resources: say so


@dataclass(frozen=True, slots=True)
class ResourcePlan:
    """What one run reserves: `workers` actors of `gpus_per_worker` GPU and `cpus_per_worker`
    CPU each, decoding tasks of `decode_cpus` CPU each; `note` says what was changed from the
    request and why (None: run as asked)."""

    workers: int
    gpus_per_worker: float
    cpus_per_worker: float
    decode_cpus: float
    cluster_cpus: float
    cluster_gpus: float
    note: str | None = None


def plan_resources(options: "RayOptions", cluster: Mapping[str, float]) -> ResourcePlan:
    """The reservations of a run of `options` on a cluster with `cluster` resources (Ray's
    `cluster_resources()`), leaving CPU for decoding beside the actors.

    Raises ConfigError when the request cannot run there: actors asking for more GPUs than the
    cluster has, or asked-for actors that leave no CPU for decoding (the message says which
    --workers or --cpus-per-worker would run)."""
    cpus, gpus_total = float(cluster.get("CPU", 0.0)), float(cluster.get("GPU", 0.0))
    gpus = options.gpus_per_worker
    if gpus is None:
        gpus = 1.0 if gpus_total > 0 else 0.0
    if gpus > gpus_total:
        raise ConfigError(f"each embedding actor asks for {gpus:g} GPU and this Ray cluster has {gpus_total:g}",
                          hint="use RayOptions(gpus_per_worker=0) for CPU actors, or join a cluster with GPUs",
                          cli_hint="use --gpus-per-worker 0 for CPU actors, or --ray ADDRESS of a cluster with GPUs")
    asked = options.workers
    workers = asked if asked is not None else (max(1, int(gpus_total // gpus)) if gpus > 0 else 1)
    per_actor, decode, note = options.cpus_per_worker, options.decode_cpus, None
    gpu_fit = int(gpus_total // gpus) if gpus > 0 else workers
    cpu_fit = math.ceil(cpus / per_actor) - 1  # most actors that leave some CPU free
    if asked is not None and asked > gpu_fit:
        _refuse(f"{asked} workers x {gpus:g} GPU need {asked * gpus:g} GPUs and this Ray cluster has {gpus_total:g}",
                _fitting(cpus, gpu_fit, cpu_fit, asked, decode))
    free = cpus - workers * per_actor
    if free <= 0:
        if asked is None and cpu_fit >= 1:
            note = (f"{cpu_fit} embedding actors instead of {workers}: {workers} x {per_actor:g} CPU would leave no "
                    f"CPU for decoding on this {cpus:g}-CPU cluster")
            workers, free = cpu_fit, cpus - cpu_fit * per_actor
        else:
            _refuse(f"{workers} workers x {per_actor:g} CPU leaves no CPU for decoding on this {cpus:g}-CPU Ray "
                    f"cluster", _fitting(cpus, gpu_fit, cpu_fit, workers, decode))
    if free < decode:  # decoding gets what the actors leave: slower, never stuck
        decode = free
        note = ((note + "; ") if note else "") + f"decoding tasks get {free:g} CPU each (the actors hold the rest)"
    return ResourcePlan(workers, gpus, per_actor, decode, cpus, gpus_total, note)


def _fitting(cpus: float, gpu_fit: int, cpu_fit: int, workers: int, decode: float) -> list[dict[str, float]]:
    """Settings that run: fewer actors at the asked CPUs, or (as many actors as the GPUs allow)
    a CPU share per actor that leaves decoding its CPUs (half the cluster when it is smaller)."""
    choices: list[dict[str, float]] = []
    if min(gpu_fit, cpu_fit) >= 1:
        choices.append({"workers": min(gpu_fit, cpu_fit)})
    keep = min(workers, gpu_fit)
    share = _round_down(max(cpus - decode, cpus / 2) / keep) if keep >= 1 else 0.0
    if share > 0:
        choices.append(({"workers": keep} if keep != workers else {}) | {"cpus_per_worker": share})
    return choices


def _refuse(message: str, choices: list[dict[str, float]]) -> None:
    """Raise the ConfigError of a request that cannot run, with the settings that would."""
    python = " or ".join("RayOptions(" + ", ".join(f"{k}={v:g}" for k, v in c.items()) + ")" for c in choices)
    cli = " or ".join(" ".join(f"--{k.replace('_', '-')} {v:g}" for k, v in c.items()) for c in choices)
    raise ConfigError(message, hint=f"use {python}" if choices else None, cli_hint=f"use {cli}" if choices else None)


def _round_down(value: float) -> float:
    """`value` rounded down to a tenth (to a hundredth below 0.1): a share a user would type."""
    step = 0.1 if value >= 0.1 else 0.01
    return math.floor(value / step + 1e-9) * step


def describe_wait(plan: ResourcePlan, available: Mapping[str, float]) -> str | None:
    """What the pipeline's work waits for, given Ray's free resources (`available_resources()`),
    or None when both stages could start a task now (the run is slow, not stuck)."""
    free_cpus, free_gpus = float(available.get("CPU", 0.0)), float(available.get("GPU", 0.0))
    waits = []
    if free_cpus < plan.decode_cpus:
        waits.append(f"decoding tasks wait for {plan.decode_cpus:g} CPU each and Ray has {free_cpus:g} of "
                     f"{plan.cluster_cpus:g} CPU free ({plan.workers} embedding actors hold "
                     f"{plan.cpus_per_worker:g} CPU each)")
    if plan.gpus_per_worker > 0 and free_gpus < plan.gpus_per_worker:
        waits.append(f"embedding actors need {plan.gpus_per_worker:g} GPU each and Ray has {free_gpus:g} of "
                     f"{plan.cluster_gpus:g} GPU free")
    if not waits:
        return None
    return "; ".join(waits)


class StallWatch:
    """Says once per stall (a log warning: the CLI prints it on stderr) when no result has come
    back for `after_s` seconds and `waiting()` names work that waits for resources.

    `clock` and `waiting` are injectable so a test drives a stall without waiting for one."""

    def __init__(self, waiting: Callable[[], str | None], after_s: float = STALL_AFTER_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.waiting, self.after_s, self.clock = waiting, after_s, clock
        self.last_result = clock()
        self.warned = False

    def progressed(self) -> None:
        """A result came back: the run is moving."""
        self.last_result = self.clock()
        self.warned = False

    def check(self) -> str | None:
        """The warning said now (None when the run is moving or no work waits for resources)."""
        idle = self.clock() - self.last_result
        if self.warned or idle < self.after_s:
            return None
        waits = self.waiting()
        if waits is None:
            return None
        self.warned = True
        message = (f"Ray run stalled: no result for {idle:.0f} s; {waits}; stop it (Ctrl-C: committed files are kept) "
                   f"and run again with fewer embedding actors or fewer CPUs each")
        log.warning("%s", message)
        return message


@contextmanager
def watching(watch: StallWatch, every_s: float = 10.0) -> Iterator[StallWatch]:
    """Run `watch.check()` every `every_s` seconds in a daemon thread while the block runs."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(every_s):
            try:
                watch.check()
            except Exception as error:  # a failed probe never ends the run it watches
                log.debug("stall check failed: %s", error)

    thread = threading.Thread(target=loop, name="faste-mm-ray-stall-watch", daemon=True)
    thread.start()
    try:
        yield watch
    finally:
        stop.set()
        thread.join()

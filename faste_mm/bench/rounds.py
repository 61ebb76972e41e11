"""Mirrored rounds: the one timing loop of the benchmark suites (faste_mm.bench). Receives
contenders (name -> a call that does one run) and a round count; hands back each contender's
seconds per timed round and what its calls returned.

Why mirrored: on a shared machine the load drifts during a run, and a fixed order favours whoever
runs when it is lightest. Every round runs every contender once, in reversed order every other
round (A B C, C B A, A B C, ...), so a linear drift falls on all of them alike over an even number
of rounds. On CUDA the device is synchronised before the clock starts and before it stops: kernels
run asynchronously, and without it a call is timed by its launches and the next contender pays
for its kernels.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping


@dataclass(frozen=True, slots=True)
class Timed:
    """One contender's timed rounds: seconds [rounds] and the calls' outputs [rounds], in round order."""

    seconds: tuple[float, ...]
    outputs: tuple[Any, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def best(self) -> float:
        return min(self.seconds)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.seconds)

    @property
    def output(self) -> Any:
        """The last timed call's output."""
        return self.outputs[-1]


def round_order(names: list[str], round_index: int) -> list[str]:
    """The contenders' order in timed round `round_index` (0 = the first): as given in even
    rounds, reversed in odd ones (warm-up rounds count down from -1: the first timed round's reverse)."""
    return names if round_index % 2 == 0 else names[::-1]


def mirrored_rounds(contenders: Mapping[str, Callable[[], Any]], rounds: int, *, warmup: int = 1,
                    device: Any = None, clock: Callable[[], float] = time.perf_counter) -> dict[str, Timed]:
    """Run every contender once per round, `warmup` untimed rounds first, the order mirrored
    every other round (`round_order`); returns {name: Timed} in the contenders' order.

    device: where the contenders compute (a torch device or its name; None = the CPU): on CUDA
        the device is synchronised before and after each timed call.
    clock: seconds (tests pass their own).
    Raises ValueError for rounds < 1, warmup < 0 or no contenders.
    """
    if not contenders:
        raise ValueError("mirrored_rounds needs at least one contender")
    if rounds < 1 or warmup < 0:
        raise ValueError(f"mirrored_rounds needs rounds >= 1 and warmup >= 0, got rounds={rounds}, warmup={warmup}")
    names = list(contenders)
    synchronize = _synchronizer(device)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    outputs: dict[str, list[Any]] = {name: [] for name in names}
    for round_index in range(-warmup, rounds):
        for name in round_order(names, round_index):
            synchronize()
            started = clock()
            output = contenders[name]()
            synchronize()
            if round_index >= 0:
                seconds[name].append(clock() - started)
                outputs[name].append(output)
    return {name: Timed(tuple(seconds[name]), tuple(outputs[name])) for name in names}


def _synchronizer(device: Any) -> Callable[[], None]:
    """A call that waits for `device`'s queued kernels (a no-op off CUDA)."""
    if device is None or "cuda" not in str(device):
        return lambda: None
    return lambda: _cuda_synchronize(device)


def _cuda_synchronize(device: Any) -> None:
    """Wait for the CUDA device's queued kernels (a call of its own: tests without a GPU watch it)."""
    import torch  # only where a CUDA device is named: the CPU scripts' loop needs no torch

    torch.cuda.synchronize(device)

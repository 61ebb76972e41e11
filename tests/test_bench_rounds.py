"""The benchmark scripts' one timing loop (faste_mm.bench.rounds): order mirrored every other
round, warm-ups untimed, each timed call's seconds and output kept, and a CUDA device synchronised
around each timed call. A counting clock stands in for time (no timed tests)."""

from __future__ import annotations

import pytest

from faste_mm.bench import rounds as bench_rounds
from faste_mm.bench.rounds import Timed, mirrored_rounds


class _Clock:
    """Time that moves only when a contender spends it (`spend`)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def spend(self, seconds: float) -> None:
        self.now += seconds


def test_each_round_runs_everyone_once_in_mirrored_order_after_untimed_warmups():
    calls = []
    contenders = {name: (lambda name=name: calls.append(name)) for name in "ABC"}
    mirrored_rounds(contenders, rounds=3, warmup=1)
    assert calls == list("CBA" "ABC" "CBA" "ABC")  # the warm-up is the first timed round's reverse
    calls.clear()
    mirrored_rounds(contenders, rounds=2, warmup=0)
    assert calls == list("ABC" "CBA")


def test_only_timed_rounds_are_kept_with_each_calls_own_seconds_and_output():
    clock, costs, counts = _Clock(), {"fast": 1.0, "slow": 3.0}, {"fast": 0, "slow": 0}

    def run(name: str):
        counts[name] += 1
        clock.spend(costs[name] * counts[name])  # the nth call costs n x its base
        return (name, counts[name])

    timed = mirrored_rounds({name: (lambda name=name: run(name)) for name in costs}, rounds=3, warmup=2, clock=clock)
    assert list(timed) == ["fast", "slow"]
    assert timed["fast"] == Timed((3.0, 4.0, 5.0), (("fast", 3), ("fast", 4), ("fast", 5)))  # calls 1-2 warmed up
    assert timed["slow"].seconds == (9.0, 12.0, 15.0) and timed["slow"].output == ("slow", 5)
    assert (timed["slow"].median, timed["slow"].best, timed["slow"].mean) == (12.0, 9.0, 12.0)


def test_a_cuda_device_is_synchronised_before_and_after_each_call(monkeypatch):
    import torch

    events = []
    monkeypatch.setattr(bench_rounds, "_cuda_synchronize", lambda device: events.append(("sync", str(device))))
    contenders = {name: (lambda name=name: events.append(name)) for name in "AB"}
    mirrored_rounds(contenders, rounds=1, warmup=0, device="cuda:0")
    assert events == [("sync", "cuda:0"), "A", ("sync", "cuda:0"), ("sync", "cuda:0"), "B", ("sync", "cuda:0")]
    events.clear()
    mirrored_rounds(contenders, rounds=1, warmup=0, device=torch.device("cpu"))
    assert events == ["A", "B"]  # nothing to wait for off CUDA


@pytest.mark.parametrize("rounds, warmup, contenders", [(0, 1, {"A": int}), (2, -1, {"A": int}), (2, 1, {})])
def test_no_rounds_a_negative_warmup_or_no_contenders_is_refused(rounds, warmup, contenders):
    with pytest.raises(ValueError, match="mirrored_rounds needs"):
        mirrored_rounds(contenders, rounds=rounds, warmup=warmup)


def test_the_round_order_mirrors_every_other_round():
    names = ["A", "B", "C"]
    assert [bench_rounds.round_order(names, i) for i in (-1, 0, 1, 2)] == [names[::-1], names, names[::-1], names]

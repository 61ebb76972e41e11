"""Threads and batches for the machine, side by side in ONE process with mirrored rounds: the
embedder at the machine plan's settings (faste_mm/model/cpu/machine_plan.py: torch threads,
preprocessing threads, batch tokens for the cores this process may use) against the same weights
with one of those settings changed at a time, on each input kind; the table says which won on
this machine and by how much the plan trails it. What chose the plan's rule (docs/cpu.md
"Threads", docs/performance.md "Threads and batches for the machine").

    taskset -c 0 faste-mm bench threads --layers 2 --blocks 2 --rounds 2
    faste-mm bench threads --layers 2 --blocks 2 --rounds 2 --out docs/bench/threads-2core.json

The model is the real Qwen3-VL-Embedding-2B width with `--layers` decoder layers and `--blocks`
tower blocks (random weights, faste_mm/bench/cpu.py builds it), or `--model DIR`.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass
from pathlib import Path

import torch

from faste_mm.bench.options import add_dtype, add_model, add_rounds, add_workdir, ints, scratch
from faste_mm.bench.rounds import mirrored_rounds
from faste_mm.bench.schema import SuiteRun
from faste_mm.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Setting:
    """One contender: torch intra-op threads, preprocessing threads (0 = in the model's thread)
    and the batch's padded-token budget."""

    threads: int
    workers: int
    batch_tokens: int

    @property
    def name(self) -> str:
        return f"t{self.threads} w{self.workers} b{self.batch_tokens}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--layers", type=int, default=2, help="decoder layers of the built 2B-width model (default 2; the real one has 28)")
    parser.add_argument("--blocks", type=int, default=2, help="vision tower blocks of the built model (default 2; the real one has 24)")
    add_model(parser)
    add_dtype(parser)
    parser.add_argument("--kinds", default="image:640x480:6,text:1000:8",
                        help="KIND:SIZE:N,... (image and page WxH, text TOKENS; default image:640x480:6,text:1000:8)")
    parser.add_argument("--threads", default=None,
                        help="torch threads to try beside the plan's, comma-separated (default: 1 and the plan's)")
    parser.add_argument("--workers", default=None,
                        help="preprocessing threads to try beside the plan's, comma-separated (default: 0, 1 and the plan's)")
    parser.add_argument("--budgets", default="2048,4096,8192",
                        help="batch tokens to try beside the plan's, comma-separated (default 2048,4096,8192)")
    add_rounds(parser, default=2)
    add_workdir(parser)


def settings_around(plan: Setting, threads: list[int], workers: list[int], budgets: list[int]) -> list[Setting]:
    """The plan first, then each other value of one axis with the plan's other two (a full grid
    would multiply the rounds; one axis at a time shows what each choice is worth)."""
    out = [plan]
    out += [Setting(t, plan.workers, plan.batch_tokens) for t in threads]
    out += [Setting(plan.threads, w, plan.batch_tokens) for w in workers]
    out += [Setting(plan.threads, plan.workers, b) for b in budgets]
    return list(dict.fromkeys(out))


def run(args: argparse.Namespace) -> SuiteRun:
    with scratch(args.workdir, "bench-threads-") as work:
        return _run(args, work)


def _run(args: argparse.Namespace, work: Path) -> SuiteRun:
    from faste_mm import BatchingConfig, Embedder
    from faste_mm.bench.cpu import _kinds, build
    from faste_mm.bench.inputs import make_inputs
    from faste_mm.model.cpu.machine_plan import machine_plan

    plan = machine_plan(device="cpu")
    base = Setting(plan.intra_op_threads, plan.prep_threads, plan.batch_tokens)
    threads = ints(args.threads) if args.threads else [1, base.threads]
    workers = ints(args.workers) if args.workers else [0, 1, base.workers]
    budgets = ints(args.budgets)
    if any(t < 1 for t in threads) or any(w < 0 for w in workers) or any(b < 1 for b in budgets):
        raise ConfigError("--threads and --budgets take integers >= 1, --workers integers >= 0")
    settings = settings_around(base, threads, workers, budgets)
    kinds = _kinds(args.kinds)
    model = args.model or build(work / "model", args.layers, args.blocks)
    loaded = Embedder.from_pretrained(str(model), device="cpu", dtype=args.dtype)
    embedders = {s.name: loaded.with_batching(BatchingConfig(batch_tokens=s.batch_tokens, workers=s.workers))
                 for s in settings}
    tokenizer = loaded.serializer.processor.tokenizer
    rows = []
    try:
        for kind, size, n in kinds:
            inputs = make_inputs(f"{kind}:{size}", n, work / f"in-{kind}", tokenizer)

            def encode(setting: Setting):
                torch.set_num_threads(setting.threads)  # per call: each contender runs at its own count
                return embedders[setting.name].encode_documents(inputs)

            timed = mirrored_rounds({s.name: (lambda s=s: encode(s)) for s in settings}, args.repeats)
            seconds = {name: statistics.median(t.seconds) for name, t in timed.items()}
            winner = min(seconds, key=seconds.get)
            rows.append({"kind": kind, "inputs": f"{kind}:{size} x{n}", "plan": base.name, "winner": winner,
                         "plan_vs_winner": seconds[base.name] / seconds[winner],
                         "seconds": seconds, "rounds": {name: list(t.seconds) for name, t in timed.items()},
                         "items_per_s": {name: n / s for name, s in seconds.items()}})
    finally:
        torch.set_num_threads(plan.intra_op_threads)
    params = {"model": str(args.model) if args.model else "qwen3-vl-embedding-2b (real width)", "layers": args.layers,
              "tower_blocks": args.blocks, "rounds": args.repeats, "kinds": args.kinds,
              "settings": [s.name for s in settings], "machine_plan": plan.to_dict()}
    return SuiteRun(rows, params, "cpu", loaded.dtype_choice.name, {"machine_plan": plan.describe()},
                    _table(rows, settings, base))


def _table(rows: list[dict], settings: list[Setting], base: Setting) -> str:
    """Seconds per input kind and setting (median of mirrored rounds), the winner marked."""
    lines = [f"seconds per run, median of mirrored rounds; t torch threads, w preprocessing threads, b batch tokens; "
             f"plan: {base.name}",
             "| setting | " + " | ".join(row["inputs"] for row in rows) + " |", "|---|" + "---:|" * len(rows)]
    for s in settings:
        cells = [f"{row['seconds'][s.name]:.2f}{' (best)' if row['winner'] == s.name else ''}" for row in rows]
        lines.append(f"| {s.name}{' (plan)' if s == base else ''} | " + " | ".join(cells) + " |")
    lines.append("| plan / best | " + " | ".join(f"{row['plan_vs_winner']:.2f}x" for row in rows) + " |")
    return "\n".join(lines)

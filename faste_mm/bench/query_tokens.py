"""Tokenizing a long query in `faste-mm serve`: the whole text (as before issue 27) against the
engine's bounded cut (`ServeEngine.measure`), and a check that both give the model the same tokens.

    faste-mm bench query-tokens [--model DIR] [--mib 1,2]

Without --model, a tiny random-weight Qwen3-VL (the real Qwen tokenizer) is built in a temp dir.
"""

from __future__ import annotations

import argparse
import tempfile
import time

from faste_mm import Embedder, Item
from faste_mm.bench.options import floats
from faste_mm.bench.schema import SuiteRun
from faste_mm.serving import ServeConfig, ServeEngine
from faste_mm.testing import build_tiny_model


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="model directory (default: a tiny Qwen3-VL built in a temp dir)")
    parser.add_argument("--mib", default="1,2", help="query sizes in MiB (fractions allowed), comma-separated (default 1,2)")


def run(args: argparse.Namespace) -> SuiteRun:
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        model = args.model or str(build_tiny_model(f"{scratch}/tiny", "qwen3_vl"))
        embedder = Embedder.from_pretrained(model, device="cpu")
        engine = ServeEngine(embedder, None, ServeConfig(max_request_tokens=1 << 30))
        words = "the quick brown fox jumps over the lazy dog near a red barn at dawn".split()
        for mib in floats(args.mib):
            text = " ".join(words[i % len(words)] for i in range(int(mib * 2**18)))[: int(mib * 2**20)]
            started = time.perf_counter()
            whole = embedder.serializer(Item(text=text), None)
            before = time.perf_counter() - started
            started = time.perf_counter()
            measured = engine.measure([Item(text=text)], "query")
            after = time.perf_counter() - started
            cut = embedder.serializer(measured.items[0], None)
            rows.append({"mib": mib, "chars": len(text), "whole_text_s": before, "bounded_s": after,
                         "chars_tokenized": len(measured.items[0].text), "tokens": cut.length,
                         "same_tokens": whole.input_ids.tolist() == cut.input_ids.tolist()})
    text = "\n".join(["| query | whole text s | bounded s | chars tokenized | tokens | same tokens |", "|---|---:|---:|---:|---:|---|",
                      *(f"| {r['mib']} MiB ({r['chars']} chars) | {r['whole_text_s']:.2f} | {r['bounded_s']:.3f} | "
                        f"{r['chars_tokenized']} | {r['tokens']} | {r['same_tokens']} |" for r in rows)])
    return SuiteRun(rows, {"model": args.model or "tiny qwen3_vl (random weights)", "mib": floats(args.mib)}, "cpu", text=text)

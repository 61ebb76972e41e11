"""Tokenizing a long query in `faste-mm serve`: the whole text (as before issue 27) against the
engine's bounded cut (`ServeEngine.measure`), and a check that both give the model the same tokens.

    python scripts/bench_query_tokens.py [--model DIR] [--mib 1,2]

Without --model, a tiny random-weight Qwen3-VL (the real Qwen tokenizer) is built in a temp dir.
"""

from __future__ import annotations

import argparse
import tempfile
import time

from faste_mm import Embedder, Item
from faste_mm.serving import ServeConfig, ServeEngine
from faste_mm.testing import build_tiny_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model directory (default: a tiny Qwen3-VL built in a temp dir)")
    parser.add_argument("--mib", default="1,2", help="query sizes in MiB, comma-separated (default 1,2)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        model = args.model or str(build_tiny_model(f"{scratch}/tiny", "qwen3_vl"))
        embedder = Embedder.from_pretrained(model, device="cpu")
        engine = ServeEngine(embedder, None, ServeConfig(max_request_tokens=1 << 30))
        words = "the quick brown fox jumps over the lazy dog near a red barn at dawn".split()
        for mib in (int(m) for m in args.mib.split(",")):
            text = " ".join(words[i % len(words)] for i in range(mib << 18))[: mib << 20]
            started = time.perf_counter()
            whole = embedder.serializer(Item(text=text), None)
            before = time.perf_counter() - started
            started = time.perf_counter()
            measured = engine.measure([Item(text=text)], "query")
            after = time.perf_counter() - started
            cut = embedder.serializer(measured.items[0], None)
            same = whole.input_ids.tolist() == cut.input_ids.tolist()
            print(f"{mib} MiB query ({len(text)} chars): whole text {before:.2f} s, bounded {after:.3f} s "
                  f"({len(measured.items[0].text)} chars tokenized; same {cut.length} tokens: {same})")


if __name__ == "__main__":
    main()

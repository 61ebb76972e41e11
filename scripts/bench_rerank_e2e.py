"""The reranker on pages end to end, as a user's defaults run it on a GPU: the official path
(left-padded batches of 8, preprocessing in line), faste-mm's full forward with its defaults
(background preprocessing, `batch_bytes` resolved for the device), the same with the CPU's
96 MiB batches, and FastE r=0.5 by alignment. Mirrored rounds; mean seconds per query, the
forward's own seconds, batch sizes and trigger layers. (bench_rerank.py races the settings with
one preprocessing thread, for a CPU; this script keeps each path's own preprocessing.)

    python scripts/bench_rerank_e2e.py cuda 1 20 4     # DEVICE SCALE PAGES ROUNDS (gpu_bench.sh rerank)
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # bench_rerank's shape and official path
from bench_rerank import QUERY, build_reranker_shape, official_scores  # noqa: E402
from faste_mm.model.batching import BATCH_BYTES
from faste_mm.model.faste import FastEConfig
from faste_mm.model.rerank.reranker import Reranker
from faste_mm.tools.bench_inputs import make_inputs
from faste_mm.tools.bench_rounds import mirrored_rounds
from faste_mm.tools.shapes import qwen_tokenizer_dir
from transformers import AutoTokenizer, Qwen3VLForConditionalGeneration  # noqa: E402


def main() -> None:
    device, scale, n, rounds = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])  # see the docstring
    with tempfile.TemporaryDirectory() as tmp:
        path = build_reranker_shape(Path(tmp) / "rr", "qwen3-vl-embedding-2b", scale)
        docs = make_inputs("page:1240x1754", n, Path(tmp) / "in", AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir())))
        full = Reranker.from_pretrained(str(path), device=device, dtype="bfloat16", prefix_reuse=False, tower_cache_bytes=0)
        print("defaults:", full.batching)
        small = Reranker(full.loaded, batching=replace(full.batching, batch_bytes=BATCH_BYTES["cpu"]), prefix_reuse=False, tower_cache_bytes=0)
        r5 = Reranker(full.loaded, fast_e=FastEConfig(r_max=0.5), batching=full.batching, tower_cache_bytes=0)
        lm = Qwen3VLForConditionalGeneration.from_pretrained(str(path), dtype=full.backbone.dtype).to(full.backbone.device).eval()
        full.score(QUERY, docs[:2]); official_scores(lm, full, docs[:2], 8)
        runs = [("official (batch 8, serial preprocessing)", lambda: official_scores(lm, full, docs, 8)),
                ("faste-mm full, defaults", lambda: full.score(QUERY, docs).stats),
                ("faste-mm full, batch_bytes 96 MiB", lambda: small.score(QUERY, docs).stats),
                ("FastE r=0.5 (adaptive)", lambda: r5.score(QUERY, docs).stats)]
        timed = mirrored_rounds(dict(runs), rounds, warmup=0, device=full.backbone.device)
        off = timed[runs[0][0]].mean
        for name, _ in runs:
            s, st = timed[name].mean, timed[name].output
            extra = "" if not hasattr(st, "batches") else (f"forward {st.forward_s:.3f} s, batches {[b.batch_size for b in st.batches]}, "
                     f"triggers {[b.trigger_layer for b in st.batches]}, tower {sum(b.tower_s for b in st.batches):.3f} s")
            print(f"| {name} | {s:.3f} | {off / s:.2f}x | {' / '.join(f'{x:.3f}' for x in timed[name].seconds)} | {extra} |", flush=True)


if __name__ == "__main__":
    main()

"""The reranker on pages end to end, as a user's defaults run it on a GPU: the official path
(left-padded batches of 8, preprocessing in line), faste-mm's full forward with its defaults
(background preprocessing, `batch_bytes` resolved for the device), the same with the CPU's
96 MiB batches, and FastE r=0.5 by alignment. Mirrored rounds; mean seconds per query, the
forward's own seconds, batch sizes and trigger layers. (bench_rerank.py races the settings with
one preprocessing thread, for a CPU; this script keeps each path's own preprocessing.)

    python scripts/bench_rerank_e2e.py cuda 1 20 4     # DEVICE SCALE PAGES ROUNDS (gpu_bench.sh rerank)
"""
import sys, tempfile, time
from dataclasses import replace
from pathlib import Path
import torch
sys.path.insert(0, "scripts")
from bench_rerank import build_reranker_shape, official_scores, QUERY
from faste_mm.model.faste import FastEConfig
from faste_mm.model.reranker import Reranker
from faste_mm.tools.bench_inputs import make_inputs
from faste_mm.tools.shapes import qwen_tokenizer_dir
from transformers import AutoTokenizer, Qwen3VLForConditionalGeneration

device, scale, n, rounds = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])  # see the docstring
sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
with tempfile.TemporaryDirectory() as tmp:
    path = build_reranker_shape(Path(tmp) / "rr", "qwen3-vl-embedding-2b", scale)
    docs = make_inputs("page:1240x1754", n, Path(tmp) / "in", AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir())))
    full = Reranker.from_pretrained(str(path), device=device, dtype="bfloat16", prefix_reuse=False, tower_cache_bytes=0)
    print("defaults:", full.batching)
    small = Reranker(full.loaded, batching=replace(full.batching, batch_bytes=96 * 2**20), prefix_reuse=False, tower_cache_bytes=0)
    r5 = Reranker(full.loaded, fast_e=FastEConfig(r_max=0.5), batching=full.batching, tower_cache_bytes=0)
    lm = Qwen3VLForConditionalGeneration.from_pretrained(str(path), dtype=full.backbone.dtype).to(full.backbone.device).eval()
    full.score(QUERY, docs[:2]); official_scores(lm, full, docs[:2], 8)
    runs = [("official (batch 8, serial preprocessing)", lambda: official_scores(lm, full, docs, 8)),
            ("faste-mm full, defaults", lambda: full.score(QUERY, docs).stats),
            ("faste-mm full, batch_bytes 96 MiB", lambda: small.score(QUERY, docs).stats),
            ("FastE r=0.5 (adaptive)", lambda: r5.score(QUERY, docs).stats)]
    times = {name: [] for name, _ in runs}; last = {}
    for rnd in range(rounds):
        for name, fn in runs if rnd % 2 == 0 else runs[::-1]:
            sync(); t = time.perf_counter(); last[name] = fn(); sync(); times[name].append(time.perf_counter() - t)
    off = sum(times[runs[0][0]]) / rounds
    for name, _ in runs:
        s = sum(times[name]) / rounds; st = last[name]
        extra = "" if not hasattr(st, "batches") else (f"forward {st.forward_s:.3f} s, batches {[b.batch_size for b in st.batches]}, "
                 f"triggers {[b.trigger_layer for b in st.batches]}, tower {sum(b.tower_s for b in st.batches):.3f} s")
        print(f"| {name} | {s:.3f} | {off / s:.2f}x | {' / '.join(f'{x:.3f}' for x in times[name])} | {extra} |", flush=True)

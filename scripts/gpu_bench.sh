#!/usr/bin/env bash
# The GPU runs of the one benchmark tool (`faste-mm bench SUITE`, faste_mm/bench), one command per
# step, for a machine with one NVIDIA GPU; every step writes the suites' result JSON: real shapes in
# bfloat16 with random weights (the timings are true), FastE at r_max 0.3/0.5/0.7 with the
# trigger forced (layer 10) and by alignment, padded vs unpadded layers after compression, the
# peers (plain HF, sentence-transformers), images/s and pages/s, GPU FAISS, the CUDA-only tests.
#
#   bash scripts/gpu_bench.sh text      # Qwen3-Embedding-0.6B / 4B shapes: 1k-4k tokens, batch >= 32 and ~4 rows, + peers
#   bash scripts/gpu_bench.sh 2b        # Qwen3-VL-Embedding-2B: 1k-4k texts (+ HF), pages at the 1,800-token cap, images
#   bash scripts/gpu_bench.sh 8b        # the same for 8B
#   bash scripts/gpu_bench.sh faiss     # search latency on 1M x 2048 random vectors, Flat and IVF, CPU vs GPU
#   bash scripts/gpu_bench.sh rerank    # the 2B reranker shape: full vs FastE r 0.3/0.5/0.7 (protect none/query) vs the official forward, texts and pages
#   bash scripts/gpu_bench.sh peers     # 2B shape: faste-mm vs the official transformers path and ST, photos/pages/texts, tower race
#   bash scripts/gpu_bench.sh pages     # the 2B at its real depth (28 layers, 24 blocks): duplicate patches, FastE, both vs transformers on rendered pages
#   bash scripts/gpu_bench.sh quick     # one call of under 10 minutes: the CUDA tests, then the 2B shape built once: photos
#                                       # (full vs FastE by alignment: what its checks cost), pages, texts (+ HF), FastE at
#                                       # layer 10, the reranker on pages (tower cache cold/warm); most wanted first
#
# DEVICE=cpu SCALE=0.0625 N=2 bash scripts/gpu_bench.sh quick   dry-runs the quick step on a CPU before a lease.
#
# Each writes its JSON reports and log to $OUT (the device tool's output folder) or ./gpu-bench-STEP.
# Packages the machine lacks travel as wheels in .whl/ (docs/benchmarks-log.md, "GPU runs").
set -uo pipefail
cd "$(dirname "$0")/.."
step=${1:?usage: gpu_bench.sh text|2b|8b|faiss|peers|rerank|pages|quick}
out=${OUT:-gpu-bench-$step}
mkdir -p "$out"
exec > >(tee "$out/log-$step.txt") 2>&1
export PYTHONUNBUFFERED=1

if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"

device=${DEVICE:-cuda}
bench() { faste-mm bench --dtype bfloat16 --device "$device" --repeats 3 "$@"; }
ratios=(--r-max 0.3,0.5,0.7)
layouts=(--unpadded off,auto,flash-attn,torch-nested)

case $step in
    text)
        python3 -m pytest -q -p no:cacheprovider tests/test_unpadded.py -k cuda
        for shape in qwen3-embedding-0.6b qwen3-embedding-4b; do
            bench --shape $shape --inputs text:1000-4000 --n 256 "${ratios[@]}" --trigger-layer 10 "${layouts[@]}" \
                --compare hf,sentence-transformers --out "$out/$shape-text-1k-4k-fixed10.json"
            bench --shape $shape --inputs text:1000-4000 --n 256 "${ratios[@]}" --unpadded auto \
                --out "$out/$shape-text-1k-4k-alignment.json"
            bench --shape $shape --inputs text:1000-4000 --n 64 "${ratios[@]}" --trigger-layer 10 --unpadded auto \
                --batch-tokens 16000 --out "$out/$shape-text-1k-4k-batch4.json"   # ~4 rows per batch: the small-batch case
        done ;;
    2b|8b)
        [ "$step" = 2b ] && n_text=256 n_pages=64 n_images=256 || n_text=128 n_pages=32 n_images=128
        shape=qwen3-vl-embedding-$step
        bench --shape $shape --inputs text:1000-4000 --n $n_text "${ratios[@]}" --trigger-layer 10 "${layouts[@]}" \
            --compare hf --out "$out/vl$step-text-1k-4k.json"
        bench --shape $shape --inputs page:1240x1754 --n $n_pages "${ratios[@]}" --trigger-layer 10 --unpadded off,auto \
            --out "$out/vl$step-pages-1800.json"
        bench --shape $shape --inputs image:1280x960 --n $n_images --r-max 0.5 --unpadded auto \
            --out "$out/vl$step-images-1280x960.json"   # images/s at the default pixel cap, full and FastE
        bench --shape $shape --inputs video:30 --n 4 --r-max 0.5,0.7 --trigger-layer 10 --unpadded auto \
            --out "$out/vl$step-video-30s.json"
        faste-mm bench batch-tokens --device cuda --scale-hidden 1 --shape $shape --inputs text:1000 --n 128 \
            --budgets 16384,32768,8192 --out "$out/vl$step-batch-tokens.json" ;;   # BATCH_TOKENS["cuda"]
    peers)
        faste-mm bench peers --device cuda --scale-hidden 1 --photos 64 --pages 16 --texts 64 --repeats 3 \
            --batch-size 16 --out "$out/peers-2b.json" ;;
    rerank)
        faste-mm bench rerank --device cuda --scale-hidden 1 --inputs text:2000 --top 20,50,100 --repeats 2 \
            --out "$out/rerank-2b-text.json"
        faste-mm bench rerank --device cuda --scale-hidden 1 --inputs page:1240x1754 --top 20,50 --repeats 2 \
            --out "$out/rerank-2b-pages.json"
        faste-mm bench rerank-e2e --device cuda --scale-hidden 1 --pages 20 --repeats 4 --out "$out/rerank-2b-pages-e2e.json" ;;
    quick)
        scale=${SCALE:-1} n=${N:-16}
        # timeouts: at most 560 s of steps, so pip, the model build and the machine's start fit in 10 minutes
        timeout 110 python3 -m pytest -q -p no:cacheprovider tests/test_unpadded.py tests/test_dtype_and_tower.py \
            tests/test_faste_look_ahead.py::test_look_ahead_on_cuda_makes_the_same_decisions_and_vectors
        python3 -c "import sys, torch; from faste_mm.tools.shapes import build_shape_model as b
b('qwen3-vl-embedding-2b', sys.argv[1], scale_hidden=float(sys.argv[2]), dtype=torch.bfloat16)" /tmp/vl2b "$scale" || exit 1
        quick() { timeout "$1" faste-mm bench --dtype bfloat16 --device "$device" --repeats 2 --model /tmp/vl2b "${@:2}"; }
        # photos first: FastE by alignment never fired on them (H200: its checks made the decoder 31% slower)
        quick 90 --inputs image:640x480 --n $((n * 4)) --r-max 0.5 --unpadded auto --out "$out/quick-photos.json"
        python3 - "$out/quick-photos.json" <<'PY'   # the check's cost in one line (the bench's own figures)
import json, sys
report = json.load(open(sys.argv[1]))
rows = {row["name"]: row for row in report["rows"]}
full, faste, check = rows["full"], rows["faste r=0.5"], report["params"]["check_cost"]
print(f"CHECK photos decoder s: full {full['decoder_s']:.4f}, FastE by alignment {faste['decoder_s']:.4f} "
      f"(trigger layer {faste['mean_trigger_layer']}, {faste['checks']} checks: "
      f"{(faste['decoder_s_per_check'] or 0) * 1e3:+.3f} ms per monitored layer)")
print(f"CHECK first batch, checked before every layer: " + ", ".join(f"{k} {v:.4f} s" for k, v in check["decoder_s"].items())
      + "; per layer " + ", ".join(f"{k} {v * 1e3:+.3f} ms" for k, v in check["per_layer_s"].items())
      + f"; check alone {check['alone_s'] * 1e3:.3f} ms; share {check['share']:.2%} of a {check['layer_s'] * 1e3:.2f} ms layer")
PY
        quick 90 --inputs page:1240x1754 --n "$n" --r-max 0.5 --trigger-layer 10 --unpadded auto --out "$out/quick-pages.json"
        quick 160 --inputs text:1000-4000 --n $((n * 4)) --r-max 0.3,0.5,0.7 --trigger-layer 10 \
            --unpadded off,auto,torch-nested --compare hf --out "$out/quick-text.json"
        timeout 100 faste-mm bench rerank --device "$device" --dtype bfloat16 --scale-hidden "$scale" --inputs page:1240x1754 \
            --top 20 --repeats 2 --r-max 0.5 --protect none --prefix-reuse on --tower-cache cold,warm --out "$out/quick-rerank-pages.json" ;;
    pages)
        faste-mm bench patch-dedup --device "$device" --dtype bfloat16 --layers 28 --blocks 24 --rounds 3 \
            --out "$out/patch-dedup-2b-full.json" ;;
    faiss)
        python3 -c "import faiss; print('faiss', faiss.__version__, 'GPUs', faiss.get_num_gpus())"
        for index in Flat IVF4096,Flat; do
            faste-mm bench search --n 1000000 --d 2048 --index-type "$index" --queries 100 --out "$out/faiss-${index//,/-}.json"
        done ;;
    *) echo "step must be text, 2b, 8b, peers, rerank, pages, quick or faiss" >&2; exit 2 ;;
esac

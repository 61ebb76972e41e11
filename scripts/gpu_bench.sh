#!/usr/bin/env bash
# Issue 5's GPU targets in one command per model size, for a machine with one NVIDIA GPU:
# real Qwen3-VL-Embedding-2B / 8B shapes in bfloat16 (random weights: the timings are true),
# 1k-4k-token text documents and one-page PDFs at the 1,800-visual-token cap, r_max 0.3/0.5/0.7,
# padded vs unpadded ("auto") layers after compression, plus the plain HF forward on the texts.
#
#   bash scripts/gpu_bench.sh 2b      # or 8b; JSON reports, the log and the CUDA kernel tests in $OUT
#
# Packages the machine lacks travel as wheels in .whl/ (see docs/benchmarks.md, "GPU runs").
set -uo pipefail
cd "$(dirname "$0")/.."
size=${1:?usage: gpu_bench.sh 2b|8b}
out=${OUT:-gpu-bench-$size}
mkdir -p "$out"
exec > >(tee "$out/log-$size.txt") 2>&1
export PYTHONUNBUFFERED=1

if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
python3 -m pytest -q -p no:cacheprovider tests/test_unpadded.py -k cuda

case $size in
    2b) n_text=256; n_pages=64 ;;
    8b) n_text=128; n_pages=32 ;;
    *) echo "size must be 2b or 8b" >&2; exit 2 ;;
esac
common=(--shape "qwen3-vl-embedding-$size" --dtype bfloat16 --device cuda --r-max 0.3,0.5,0.7
        --trigger-layer 10 --repeats 3 --unpadded off,auto)
faste-mm bench "${common[@]}" --inputs text:1000-4000 --n "$n_text" --compare hf --json "$out/vl$size-text-1k-4k.json"
faste-mm bench "${common[@]}" --inputs page:1240x1754 --n "$n_pages" --json "$out/vl$size-pages-1800.json"

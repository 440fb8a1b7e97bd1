#!/bin/sh
# ttft.sh — the H200 row of the TTFT benchmark (issue 16), run ON the GPU machine from the
# repository root with build-gpu/ carried (sh tests/gpu/build.sh here first):
#   Llama-3-8B shape, random bf16 weights (bench/mk-random-model.py, numpy), KV bf16,
#   a 4,000-token prefix + 16-token suffix: cold, --cache-dir warm (same prompt / other
#   suffix), prompt-cache file, and the O_DIRECT read of the entry (bench-ttft).
# usage: sh bench/gpu/ttft.sh [OUT_DIR]   (writes ~16 GB under /tmp)
set -e
OUT=${1:-${OUT:-/tmp}}
M=/tmp/cinfer-ttft/llama-3-8b-bf16
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/ttft-gpu.txt"
python3 bench/mk-random-model.py llama-3-8b bf16 "$M" >/dev/null
./build-gpu/bench-ttft "$M" --device cuda --kv-dtype bf16 --prefix 4000 --suffix 16 --dir /tmp/cinfer-ttft/run \
  2>&1 | tee -a "$OUT/ttft-gpu.txt"

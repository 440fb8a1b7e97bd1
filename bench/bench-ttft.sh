#!/bin/sh
# bench-ttft.sh — time to first token with a long shared prefix (cold, warm from --cache-dir,
# warm from a prompt-cache file) on a random-weight model of a real shape, with
# max_position_embeddings raised to 8192 so a 4,000-token prefix fits.
# usage: sh bench/bench-ttft.sh [SHAPE] [DTYPE] [PREFIX] [THREADS]
#   defaults: tinyllama-1.1b f16 4000 2   (model written once under ${WORK:-/tmp/cinfer-ttft})
#   FP_ONLY=1: only the load / fingerprint / tier-open (memo) timings
set -e
cd "$(dirname "$0")/.."
SHAPE=${1:-tinyllama-1.1b}; DT=${2:-f16}; PREFIX=${3:-4000}; T=${4:-2}
WORK=${WORK:-/tmp/cinfer-ttft}
dir=$WORK/$SHAPE-$DT
make -s build/bench/bench-ttft ${CUDA:+CUDA=$CUDA}
/usr/bin/python3 bench/mk-random-model.py "$SHAPE" "$DT" "$dir" >/dev/null
/usr/bin/python3 - "$dir/config.json" <<'PY'
import json, sys
p = sys.argv[1]; c = json.load(open(p)); c["max_position_embeddings"] = 8192
json.dump(c, open(p, "w"), indent=1)
PY
./build/bench/bench-ttft "$dir" --prefix "$PREFIX" --suffix 16 --threads "$T" --kv-dtype f16 --dir "$WORK/run" ${FP_ONLY:+--fp-only 1}

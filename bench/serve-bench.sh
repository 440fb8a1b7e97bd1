#!/bin/sh
# serve-bench.sh — `cinfer serve` next to llama.cpp's llama-server on the CPU, same model, same threads,
# same load, in one run: bench/serve-bench.py at 1, 8, 32 and 64 concurrent streams (aggregate decode
# tok/s, TTFT, inter-token latency p50/p99). Prints markdown table rows (BENCHMARKS.md keeps them).
#
# usage: bench/serve-bench.sh [SHAPE] [DTYPE] [THREADS] [STREAMS]
#   defaults: tinyllama-1.1b f16 2 1,8,32,64
#   env: CINFER_BENCH_DIR (default /tmp/cinfer-bench; models and GGUFs, never in the repo), NO_PEER=1 skips
#        llama-server, MAX_TOKENS / PROMPT_LEN (default 32 / 32) per stream, PORT (default 18480),
#        BUILD (default build: the build folder whose cinfer runs)
# The model is bench/mk-random-model.py's random-weight HF directory with the Llama 2 tokenizer.json;
# llama-server gets the same weights as a GGUF (bench/hf-to-gguf.py) and is built by
# ../shared/peers/llama-server-cpu.sh. Both serve up to 64 sequences: cinfer --max-batch 64,
# llama-server -np 64 with a context of 64 x (PROMPT_LEN + MAX_TOKENS + 64) and continuous batching.
set -e
cd "$(dirname "$0")/.."
SHAPE=${1:-tinyllama-1.1b}
DTYPE=${2:-f16}
T=${3:-2}
STREAMS=${4:-1,8,32,64}
MAXT=${MAX_TOKENS:-32}
PLEN=${PROMPT_LEN:-32}
PORT=${PORT:-18480}
WORK=${CINFER_BENCH_DIR:-/tmp/cinfer-bench}
SHARED=${CINFER_SHARED:-../shared}
[ -d "$SHARED/peers" ] || SHARED=/work/shared
PEER=${LLAMA_PEER_DIR:-$HOME/.cache/llama-cpp-peer}
BUILD=${BUILD:-build}
make -s all BUILD="$BUILD" >/dev/null
M=$WORK/$SHAPE-$DTYPE
/usr/bin/python3 bench/mk-random-model.py "$SHAPE" "$DTYPE" "$M" >/dev/null
[ -s "$M/tokenizer.json" ] || gzip -dc "$SHARED/tokenizers/llama2/tokenizer.json.gz" >"$M/tokenizer.json"
VOCAB=$(/usr/bin/python3 -c "import json; print(json.load(open('$M/config.json'))['vocab_size'])")

wait_up() {  # url pid
    i=0
    until curl -sf "$1/health" >/dev/null 2>&1; do
        i=$((i + 1)); [ $i -lt 1200 ] && kill -0 "$2" 2>/dev/null || { echo "serve-bench.sh: server did not start" >&2; exit 1; }
        sleep 0.25
    done
}
bench() {  # label url
    /usr/bin/python3 bench/serve-bench.py --url "$2" --streams "$STREAMS" --max-tokens "$MAXT" --prompt-len "$PLEN" \
        --vocab "$VOCAB" --label "$1"
}

"./$BUILD/cinfer" serve -m "$M" -t "$T" --port "$PORT" --max-batch 64 -q >"$WORK/serve-cinfer.log" 2>&1 &
PID=$!
wait_up "http://127.0.0.1:$PORT" $PID
bench "cinfer $SHAPE $DTYPE t=$T" "http://127.0.0.1:$PORT"
kill -TERM $PID; wait $PID || true

[ -n "$NO_PEER" ] && exit 0
BIN=$(sh "$SHARED/peers/llama-server-cpu.sh" "$PEER" | tail -1)
G=$WORK/gguf/$SHAPE-$DTYPE-same.gguf
mkdir -p "$WORK/gguf"
[ -s "$G" ] || /usr/bin/python3 bench/hf-to-gguf.py "$M" "$G" --vocab-gguf "$PEER/src/models/ggml-vocab-llama-spm.gguf" >/dev/null
CTX=$((64 * (PLEN + MAXT + 64)))
"$BIN/llama-server" -m "$G" -t "$T" --host 127.0.0.1 --port "$PORT" -np 64 -c "$CTX" -cb \
    >"$WORK/serve-llama.log" 2>&1 &
PID=$!
wait_up "http://127.0.0.1:$PORT" $PID
bench "llama-server $SHAPE $DTYPE t=$T" "http://127.0.0.1:$PORT"
kill -TERM $PID; wait $PID || true

#!/bin/sh
# bench-perplexity.sh — perplexity throughput of cinfer next to llama.cpp's llama-perplexity on the
# same weights and the same text, in the same run (issue 4, "Must be measured").
#
# Models: ../shared/models/stories260k (real weights, f32) and a TinyLlama-1.1B-shape random-weight
# f16 model written by bench/mk-random-model.py (with the Llama 2 tokenizer.json from
# ../shared/tokenizers/llama2). Each HF directory is converted to a GGUF with the same weights by
# bench/hf-to-gguf.py (llama.cpp's gguf-py; q/k rows permuted as convert_hf_to_gguf.py does).
# Text: the first 60 kB of Pride and Prejudice. Both engines score ROWS rows of 512 tokens in one
# batch (cinfer --batch-size ROWS; llama.cpp -c 512 --chunks ROWS -b 512*ROWS, so n_seq = ROWS) with
# THREADS threads. Each engine runs REPS times, alternating; the best time is kept.
#   cinfer tok/s   = rows * 511 / seconds of the forwards + scoring (mlx_lm's count; excludes load
#                    and tokenization)
#   llama.cpp tok/s = rows * 512 / "seconds per pass" (one pass = all rows; excludes load)
# llama.cpp scores only the second half of each chunk but runs the model on all 512 tokens, so the
# forward work is the same.
#
# usage: bench/bench-perplexity.sh [ROWS [THREADS [REPS]]]     (defaults 4 2 2)
# env: CINFER (default build/cinfer), CINFER_BENCH_DIR (default /tmp/cinfer-bench), LLAMA_PEER_DIR
set -e
ROWS=${1:-4}
THREADS=${2:-2}
REPS=${3:-2}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$HERE/..
SHARED=${CINFER_SHARED:-$ROOT/../shared}
[ -d "$SHARED/models" ] || SHARED=/work/shared
CINFER=${CINFER:-$ROOT/build/cinfer}
WORK=${CINFER_BENCH_DIR:-/tmp/cinfer-bench}/ppl
PEER=${LLAMA_PEER_DIR:-$HOME/.cache/llama-cpp-peer}
BIN=$(sh "$SHARED/peers/llama-cpp-cpu.sh" "$PEER" | tail -1)
PY=/usr/bin/python3
mkdir -p "$WORK"
TEXT=$WORK/text.txt
[ -s "$TEXT" ] || head -c 60000 "$SHARED/data/austen/pride-and-prejudice.txt" >"$TEXT"

# the models: HF dirs and their GGUFs
S260=$SHARED/models/stories260k
[ -s "$WORK/stories260k-f32.gguf" ] ||
    $PY "$HERE/hf-to-gguf.py" "$S260" "$WORK/stories260k-f32.gguf" --spm-vocab "$S260/sentencepiece_vocab.json" >&2
T11=$WORK/tinyllama-1.1b-f16
if [ ! -s "$T11/model.safetensors" ]; then
    $PY "$HERE/mk-random-model.py" tinyllama-1.1b f16 "$T11" >&2
fi
[ -s "$T11/tokenizer.json" ] || zcat "$SHARED/tokenizers/llama2/tokenizer.json.gz" >"$T11/tokenizer.json"
[ -s "$T11/tokenizer_config.json" ] || cp "$SHARED/tokenizers/llama2/tokenizer_config.json" "$T11/"
[ -s "$WORK/tinyllama-1.1b-f16.gguf" ] ||
    $PY "$HERE/hf-to-gguf.py" "$T11" "$WORK/tinyllama-1.1b-f16.gguf" --vocab-gguf "$PEER/src/models/ggml-vocab-llama-spm.gguf" >&2

run_cinfer() {  # DIR -> seconds perplexity
    "$CINFER" perplexity -m "$1" --data "$TEXT" --sequence-length 512 --num-samples "$ROWS" --batch-size "$ROWS" \
        --shuffle none -t "$THREADS" --json --no-progress |
        $PY -c 'import json,sys; d=json.load(sys.stdin); print(d["seconds"], d["perplexity"])'
}
run_llama() {  # GGUF -> seconds ppl
    "$BIN/llama-perplexity" -m "$1" -f "$TEXT" -c 512 --chunks "$ROWS" -b $((512 * ROWS)) -t "$THREADS" 2>&1 |
        $PY -c '
import re, sys
t = sys.stdin.read()
s = re.search(r"([0-9.]+) seconds per pass", t); p = re.search(r"Final estimate: PPL = ([0-9.]+)", t)
print(s.group(1) if s else "nan", p.group(1) if p else "nan")'
}

echo "model | engine | rows x len | threads | best s | tok/s | ppl (engine's own scoring)"
for M in stories260k tinyllama-1.1b-f16; do
    if [ $M = stories260k ]; then DIR=$S260; G=$WORK/stories260k-f32.gguf; else DIR=$T11; G=$WORK/tinyllama-1.1b-f16.gguf; fi
    bc=; bl=; pc=; pl=
    r=0
    while [ $r -lt "$REPS" ]; do
        set -- $(run_cinfer "$DIR"); [ -z "$bc" ] || [ "$(echo "$1 < $bc" | bc -l)" = 1 ] && bc=$1; pc=$2
        set -- $(run_llama "$G"); [ -z "$bl" ] || [ "$(echo "$1 < $bl" | bc -l)" = 1 ] && bl=$1; pl=$2
        r=$((r + 1))
    done
    printf "%s | cinfer | %d x 512 | %d | %.3f | %.1f | %s\n" $M "$ROWS" "$THREADS" "$bc" "$(echo "$ROWS * 511 / $bc" | bc -l)" "$pc"
    printf "%s | llama.cpp | %d x 512 | %d | %.3f | %.1f | %s\n" $M "$ROWS" "$THREADS" "$bl" "$(echo "$ROWS * 512 / $bl" | bc -l)" "$pl"
done

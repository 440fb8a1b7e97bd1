#!/bin/sh
# peer-llama-cpp.sh — llama.cpp's own llama-bench on a random-weight GGUF of a named real shape: the
# side-by-side peer for bench/bench-model (same shape, precision and thread count, same run).
#
# The peer is llama.cpp v0.4.0 from the npm package node-llama-cpp@3.21.1, built by
# ../shared/peers/llama-cpp-cpu.sh (idempotent; ~60 s once). GGUFs are written by
# ../shared/peers/mk_gguf.mjs (f32/f16; llama arch, untied output — the bytes read per token are the
# same as for a tied head). mk_gguf.mjs has no bf16 type, so BF16 GGUFs are made from the F16 one by
# llama.cpp's own `llama-quantize ... BF16` (f16 -> f32 -> bf16 round-to-nearest-even).
# GGUFs are cached under $CINFER_BENCH_DIR/gguf (default /tmp/cinfer-bench, never in the repo).
#
# usage: bench/peer-llama-cpp.sh SHAPE TYPE [THREADS [REPS [PP [TG]]]]
#   SHAPE: tinyllama-1.1b | llama-3.2-1b | tiny      TYPE: f16 | bf16 | f32 | q8_0 | q4_0
#   THREADS: comma list (default 1,2)  REPS: llama-bench -r (default 3)  PP/TG: 512/128
# prints one line per test:  llamacpp SHAPE TYPE t=N pp512 TOK/S   (and tg128)
set -e
SHAPE=${1:?usage: peer-llama-cpp.sh SHAPE TYPE [THREADS [REPS [PP [TG]]]]}
TYPE=${2:?type}
THREADS=${3:-1,2}
REPS=${4:-3}
PP=${5:-512}
TG=${6:-128}
HERE=$(cd "$(dirname "$0")" && pwd)
SHARED=${CINFER_SHARED:-$HERE/../../shared}
[ -d "$SHARED/peers" ] || SHARED=/work/shared
WORK=${CINFER_BENCH_DIR:-/tmp/cinfer-bench}
PEER=${LLAMA_PEER_DIR:-$HOME/.cache/llama-cpp-peer}
BIN=$(sh "$SHARED/peers/llama-cpp-cpu.sh" "$PEER" | tail -1)
VOC=$PEER/src/models

case $SHAPE in
tinyllama-1.1b) SA="--dim 2048 --layers 22 --heads 32 --kv-heads 4 --ffn 5632"; V=$VOC/ggml-vocab-llama-spm.gguf ;;
llama-3.2-1b)   SA="--dim 2048 --layers 16 --heads 32 --kv-heads 8 --ffn 8192 --rope-base 500000"
                V=$VOC/ggml-vocab-llama-bpe.gguf ;;
tiny)           SA="--dim 256 --layers 2 --heads 8 --kv-heads 4 --ffn 768"; V=$VOC/ggml-vocab-llama-spm.gguf ;;
*) echo "peer-llama-cpp.sh: unknown shape $SHAPE" >&2; exit 2 ;;
esac

mkdir -p "$WORK/gguf"
gguf() {  # gguf TYPE -> path (written once)
    g=$WORK/gguf/$SHAPE-$1.gguf
    if [ ! -s "$g" ]; then
        if [ "$1" = bf16 ]; then
            src=$(gguf f16)
            "$BIN/llama-quantize" "$src" "$g.part" BF16 >"$WORK/gguf/quantize.log" 2>&1 || {
                echo "peer-llama-cpp.sh: llama-quantize BF16 failed (see $WORK/gguf/quantize.log)" >&2; exit 1; }
        else
            node "$SHARED/peers/mk_gguf.mjs" --vocab "$V" --out "$g.part" --type "$1" $SA >&2
        fi
        mv "$g.part" "$g"
    fi
    echo "$g"
}
M=$(gguf "$TYPE")

# jsonl: one object per test; keep n_prompt, n_gen, n_threads, avg_ts, stddev_ts
"$BIN/llama-bench" -m "$M" -p "$PP" -n "$TG" -t "$THREADS" -r "$REPS" -o jsonl 2>/dev/null |
/usr/bin/python3 -c '
import json, sys
shape, typ = sys.argv[1], sys.argv[2]
for line in sys.stdin:
    line = line.strip()
    if not line.startswith("{"):
        continue
    r = json.loads(line)
    test = "pp%d" % r["n_prompt"] if r["n_prompt"] else "tg%d" % r["n_gen"]
    print("llamacpp %s %s t=%d %s %.2f +- %.2f" % (shape, typ, r["n_threads"], test,
          r["avg_ts"], r["stddev_ts"]))
' "$SHAPE" "$TYPE"

#!/usr/bin/env bash
# llama.cpp's llama-perplexity on one H200 next to cinfer's scoring benchmark (issue 18's peer), one
# device call, time-guarded:
#   1. unpack llama.cpp (TAR: the ~5-9 MB source tarball of ../shared/peers/README.md) and build only
#      llama-perplexity for sm_90 (CUDA), while
#   2. gen_random_gguf.py (GEN_PY, ../shared/peers/gen_random_gguf.py) writes random F16 GGUFs of the
#      prose-13m shape (added here: vocab 32000, hidden 256, ffn 768, 6 layers, 4 heads, 2 KV heads,
#      tied), Llama-3.2-1B and Llama-3-8B, with VOCAB_GGUF's vocabulary (llama.cpp's
#      models/ggml-vocab-llama-spm.gguf = Llama 2's, padded with unused tokens to 128,256: the script's
#      synthetic vocabulary made llama.cpp's tokenizer run for minutes on a book), and
#   0. first, alone on the GPU (CINFER=1; CINFER=after: once llama.cpp is built): cinfer's scoring benchmark, build-gpu/bench-cuda
#      BENCH_SCORE="512 2048" on the same three shapes (random bf16 weights), so both engines are
#      measured in one call;
#   3. llama-perplexity -ngl 99 -fa on -c L -b 8192 -f TEXT for L in 512 2048 on each shape, each with
#      --chunks N and 2N: the difference of the two wall times is the rate of scoring alone (model load,
#      tokenization and warm-up cancel), and its "prompt eval time" line is the forwards' own rate;
#      then (prose shape, L 512) --kl-divergence-base FILE and --kl-divergence: llama.cpp's KL.
# llama-perplexity evaluates every position of a chunk but scores only its second half (positions
# L/2 .. L-2 predict the next token: L - 1 - L/2 a chunk), and copies those logits to the host and
# reduces them on its CPU threads; the summary gives evaluated and scored positions per second.
# WHILE_BUILD: a command run while llama.cpp builds (the GPU is otherwise idle then).
# usage (GPU machine): TAR=llama-src.tar.xz GEN_PY=gen_random_gguf.py VOCAB_GGUF=ggml-vocab-llama-spm.gguf \
#   TEXT=book.txt OUT=dir [CINFER=1|after] [WHILE_BUILD=cmd] \
#   bash bench/gpu/llama-cpp-ppl.sh
set -u
START=$(date +%s)
BUDGET=${BUDGET:-580}
OUT=${OUT:-/tmp/llamacpp_ppl}; mkdir -p "$OUT"
TAR=${TAR:-llama-src.tar.xz}
GEN_PY=${GEN_PY:-gen_random_gguf.py}
TEXT=${TEXT:-book.txt}
SRC=${SRC:-/tmp/llama}
MD=${MD:-/tmp/models}
SHAPES=${SHAPES:-"prose 1b 8b"}
NP=$(nproc)
exec > >(tee -a "$OUT/log.txt") 2>&1
left() { echo $(( START + BUDGET - $(date +%s) )); }
ts() { echo "[t=$(( $(date +%s) - START ))s left=$(left)s] $*"; }

ts "host: $(hostname) nproc=$NP"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version,power.limit,memory.total --format=csv | tee "$OUT/nvidia-smi.txt"
cinfer_score() {   # cinfer's scoring benchmark on the same three shapes
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader > "$OUT/cinfer-score.log"
  for s in prose-13m llama-3.2-1b llama-3-8b; do
    ts "cinfer: BENCH_ONLY=1 BENCH_SCORE=\"512 2048\" bench-cuda $s" | tee -a "$OUT/cinfer-score.log"
    BENCH_ONLY=1 BENCH_SCORE="512 2048" timeout 120 build-gpu/bench-cuda $s /tmp/bs-$s 2048 16 >> "$OUT/cinfer-score.log" 2>&1
    echo "rc=$?" >> "$OUT/cinfer-score.log"
    rm -rf /tmp/bs-$s
  done
  grep -v '^{' "$OUT/cinfer-score.log"
}
[ "${CINFER:-}" = 1 ] && cinfer_score   # first, alone on the machine
mkdir -p "$MD"
bash "$(dirname "$0")/llama-src.sh" unpack "$TAR" "$SRC" perplexity || { ts "FATAL: untar failed"; exit 1; }
GEN_DIR=$(cd "$(dirname "$GEN_PY")" && pwd)
( cd /tmp && PYTHONPATH="$SRC/gguf-py:$GEN_DIR" PYTHONUNBUFFERED=1 python3 - "$MD" $SHAPES > "$OUT/gen.log" 2>&1 <<'PY'
import sys
import gen_random_gguf as g
g.SHAPES["prose"] = dict(name="prose-13m-shape-random", vocab=32000, hidden=256, ffn=768, layers=6, heads=4,
                         kv_heads=2, theta=10000.0, tied=True, ctx=4096)
for k in g.SHAPES: g.SHAPES[k]["ctx"] = max(g.SHAPES[k]["ctx"], 4096)
import os, gguf
if os.environ.get("VOCAB_GGUF"):   # a real SentencePiece vocab (Llama 2's), padded with unused tokens to the shape's size:
    r = gguf.GGUFReader(os.environ["VOCAB_GGUF"])   # llama.cpp tokenizes text with it at a normal speed
    f = {k: r.fields["tokenizer.ggml." + k] for k in ("tokens", "scores", "token_type")}
    toks = [bytes(f["tokens"].parts[i]) for i in f["tokens"].data]
    scores = [float(f["scores"].parts[i][0]) for i in f["scores"].data]
    types = [int(f["token_type"].parts[i][0]) for i in f["token_type"].data]
    def vocab(n):
        T, S, Y = toks[:n], scores[:n], types[:n]
        T += [("<pad%d>" % i).encode() for i in range(n - len(T))]
        S += [-1e9] * (n - len(S))
        Y += [int(gguf.TokenType.UNUSED)] * (n - len(Y))
        return T, S, Y
    g.vocab = vocab
sys.argv = ["gen_random_gguf.py"] + sys.argv[1:]
g.main()
PY
  echo "gen rc=$?" >> "$OUT/gen.log" ) &
GEN_PID=$!
bash "$(dirname "$0")/llama-src.sh" configure "$SRC" "$OUT/build.log" || ts "FATAL: configure failed"
ts "ninja llama-perplexity (background)"
( timeout $(( $(left) - 120 )) ninja -C "$SRC/build" -j $(( NP + 2 )) llama-perplexity >> "$OUT/build.log" 2>&1
  echo "ninja rc=$?" >> "$OUT/build.log" ) &
BUILD_PID=$!
if [ -n "${WHILE_BUILD:-}" ]; then ts "while the build runs: $WHILE_BUILD"; sh -c "$WHILE_BUILD"; ts "done: $WHILE_BUILD"; fi

wait "$BUILD_PID"; tail -1 "$OUT/build.log"
BIN="$SRC/build/bin"
[ -x "$BIN/llama-perplexity" ] || { ts "FATAL: no llama-perplexity"; grep -E "error|FAILED" "$OUT/build.log" | head; exit 1; }
ts "build done; waiting for the GGUFs"; wait "$GEN_PID"; tail -3 "$OUT/gen.log"; ls -la "$MD"
[ "${CINFER:-}" = after ] && cinfer_score   # after llama.cpp's build, alone on the GPU
: > "$OUT/runs.txt"
run_ppl() {   # kind shape L chunks [extra args...]
  local kind=$1 s=$2 L=$3 n=$4; shift 4
  local t=$(( $(left) - 5 )); [ $t -gt 15 ] || { ts "skip $kind $s L=$L x$n: time"; return; }
  local log="$OUT/$kind-$s-$L-$n.log"
  local t0=$(date +%s.%N)
  timeout $t "$BIN/llama-perplexity" -m "$MD/llama-$s-f16.gguf" -f "$TEXT" -ngl 99 -fa on -c "$L" -b 8192 \
    --chunks "$n" "$@" > "$log" 2>&1
  local rc=$? t1=$(date +%s.%N)
  echo "$kind $s $L $n $rc $(awk "BEGIN{print $t1 - $t0}") $(basename "$log")" | tee -a "$OUT/runs.txt"
  grep -E "prompt eval time|Final estimate|Mean +KLD|tokenizing the input" "$log" | head -4
}
for s in $SHAPES; do
  case $s in prose) n5=128 n2=32 ;; 1b) n5=64 n2=16 ;; *) n5=32 n2=8 ;; esac
  for L in 512 2048; do
    n=$([ $L = 512 ] && echo $n5 || echo $n2)
    run_ppl ppl $s $L $n
    run_ppl ppl $s $L $(( 2 * n ))
  done
done
case " $SHAPES " in *" prose "*)
  run_ppl kl-base prose 512 64 --kl-divergence-base /tmp/prose-kl.bin
  run_ppl kl prose 512 64 --kl-divergence-base /tmp/prose-kl.bin --kl-divergence
  rm -f /tmp/prose-kl.bin ;;
esac
python3 - "$OUT" <<'PY' | tee "$OUT/summary.md"
import re, sys, os
out = sys.argv[1]
runs = {}
for l in open(os.path.join(out, "runs.txt")):
    kind, s, L, n, rc, wall, log = l.split()
    L, n = int(L), int(n)
    txt = open(os.path.join(out, log), errors="replace").read()
    m = re.search(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens", txt)
    runs[(kind, s, L, n)] = (int(rc), float(wall), (float(m.group(1)), int(m.group(2))) if m else None)
print("| run | shape | L | chunks | rc | wall s | evaluated pos/s (prompt eval) | scored pos/s (prompt eval) | scored pos/s (wall, N vs 2N) |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
for (kind, s, L, n), (rc, wall, pe) in runs.items():
    per = L - 1 - L // 2
    ev = f"{pe[1] / pe[0] * 1e3:,.0f}" if pe else "-"
    sc = f"{n * per / pe[0] * 1e3:,.0f}" if pe else "-"
    half = runs.get((kind, s, L, n // 2))
    marg = f"{(n - n // 2) * per / (wall - half[1]):,.0f}" if half and wall > half[1] else ""
    print(f"| {kind} | {s} | {L} | {n} | {rc} | {wall:.1f} | {ev} | {sc} | {marg} |")
PY
ts "all done"

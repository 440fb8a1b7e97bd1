#!/usr/bin/env bash
# llama.cpp's quantized KV on one H200 (issue 15's peer), one device call, time-guarded:
#   1. unpack llama.cpp (TAR: the ~5-9 MB source tarball of ../shared/peers/README.md), build only
#      llama-bench for sm_90 (CUDA; GGML_CUDA_FA_ALL_QUANTS=OFF still builds the f16/f16, q8_0/q8_0 and
#      q4_0/q4_0 flash-attention kernels), while
#   2. gen_random_gguf.py (GEN_PY, ../shared/peers/gen_random_gguf.py) writes the Llama-3-8B F16 GGUF
#      with Llama-3.1's context (n_ctx_train 131072, so -d 131072 is inside the trained context),
#   3. for KV in f16 q4_0 q8_0: llama-bench -ngl 99 -fa 1 -n 32 -p 0 -d 4096,32768,131072 -r 2
#      -ctk KV -ctv KV (one invocation per KV type; jsonl lines land as each test finishes).
# Partial results stay in $OUT (log.txt, results.jsonl, build.log, gen.log, summary.md).
# usage (GPU machine): TAR=llama-src.tar.xz GEN_PY=gen_random_gguf.py OUT=dir bash bench/gpu/llama-cpp-kvq.sh
# STAGE=build does 1-2 only, at nice 19 with the GGUF's random numbers from the CPU (it can run beside a GPU
# benchmark of cinfer in the same call); STAGE=bench does 3 only, with the SRC and MD a build stage left (a later
# call on the same warm machine: point SRC and MD at git-ignored folders of the tree, which the machine keeps).
set -u
START=$(date +%s)
BUDGET=${BUDGET:-460}                 # seconds of wall time this script may use
OUT=${OUT:-/tmp/llamacpp_kvq}; mkdir -p "$OUT"
TAR=${TAR:-llama-src.tar.xz}
GEN_PY=${GEN_PY:-gen_random_gguf.py}
SRC=${SRC:-/tmp/llama}
MD=${MD:-/tmp/models}
KVS=${KVS:-"f16 q4_0 q8_0"}
STAGE=${STAGE:-all}
DEPTHS=${DEPTHS:-4096,32768,131072}
NP=$(nproc)
exec > >(tee -a "$OUT/log.txt") 2>&1
left() { echo $(( START + BUDGET - $(date +%s) )); }
ts() { echo "[t=$(( $(date +%s) - START ))s left=$(left)s] $*"; }

ts "host: $(hostname) nproc=$NP"
grep -m1 "model name" /proc/cpuinfo
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,driver_version,power.limit,memory.total --format=csv | tee "$OUT/nvidia-smi.txt"
nvcc --version | tail -1

if [ "$STAGE" != bench ]; then
GEN_ENV=env; NICE=
[ "$STAGE" = build ] && { GEN_ENV="env CUDA_VISIBLE_DEVICES="; NICE="nice -n 19"; }
ts "unpack $TAR"
bash "$(dirname "$0")/llama-src.sh" unpack "$TAR" "$SRC" llama-bench || { ts "FATAL: untar failed"; exit 1; }

mkdir -p "$MD"
ts "start model generation (Llama-3-8B F16, n_ctx_train 131072) -> $MD"
GEN_DIR=$(cd "$(dirname "$GEN_PY")" && pwd)
( cd /tmp && $GEN_ENV PYTHONPATH="$SRC/gguf-py:$GEN_DIR" PYTHONUNBUFFERED=1 python3 - "$MD" > "$OUT/gen.log" 2>&1 <<'PY'
import sys
import gen_random_gguf as g
g.SHAPES["8b"]["ctx"] = 131072          # Llama-3.1-8B's context
sys.argv = ["gen_random_gguf.py", sys.argv[1], "8b"]
g.main()
PY
  echo "gen rc=$?" >> "$OUT/gen.log" ) &
GEN_PID=$!

bash "$(dirname "$0")/llama-src.sh" configure "$SRC" "$OUT/build.log" || ts "FATAL: configure failed"
( while sleep 30; do echo "  [build t=$(( $(date +%s) - START ))s] $(grep -E '^\[[0-9]+/[0-9]+\]' "$OUT/build.log" | tail -1 | cut -c1-90)"; tail -1 "$OUT/gen.log" 2>/dev/null; done ) &
MON_PID=$!
ts "ninja -j $(( NP + 2 )) llama-bench"
timeout $(( $(left) - 60 )) $NICE ninja -C "$SRC/build" -j $(( NP + 2 )) llama-bench >> "$OUT/build.log" 2>&1
rc=$?
kill "$MON_PID" 2>/dev/null
BIN="$SRC/build/bin"
[ -x "$BIN/llama-bench" ] || { ts "FATAL: no llama-bench (rc=$rc)"; grep -E "error|FAILED" "$OUT/build.log" | head; wait "$GEN_PID"; cat "$OUT/gen.log"; exit 1; }
ts "build done"
ts "waiting for generation"; wait "$GEN_PID"; cat "$OUT/gen.log"; ls -la "$MD"
[ "$STAGE" = build ] && { ts "build stage done"; exit 0; }
fi
BIN="$SRC/build/bin"
[ -x "$BIN/llama-bench" ] || { ts "FATAL: no llama-bench in $BIN"; exit 1; }
M=$MD/llama-8b-f16.gguf
: > "$OUT/results.jsonl"
for kv in $KVS; do
  t=$(( $(left) - 3 )); [ $t -gt 20 ] || { ts "skip KV $kv: time"; continue; }
  ts "llama-bench -m $(basename "$M") -ngl 99 -fa 1 -n 32 -p 0 -d $DEPTHS -r 2 -ctk $kv -ctv $kv"
  timeout $t "$BIN/llama-bench" -m "$M" -ngl 99 -fa 1 -n 32 -p 0 -d "$DEPTHS" -r 2 -ctk "$kv" -ctv "$kv" \
    -o jsonl -oe md 2>&1 >> "$OUT/results.jsonl" | grep --line-buffered -v "^$"
  ts "KV $kv rc=$?"
done
python3 - "$OUT/results.jsonl" <<'PY' | tee "$OUT/summary.md"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith('{')]
print("| model | KV (ctk/ctv) | depth | test | tok/s | stddev | weights GB |")
print("|---|---|---:|---|---:|---:|---:|")
for r in rows:
    print(f"| {r['model_type']} | {r['type_k']}/{r['type_v']} | {r['n_depth']} | tg{r['n_gen']} | {r['avg_ts']:.1f} "
          f"| {r['stddev_ts']:.1f} | {r['model_size']/1e9:.3f} |")
if rows:
    r = rows[0]
    print(f"\nbuild {r.get('build_commit')} ({r.get('build_number')}), backends {r.get('backends')}, gpu {r.get('gpu_info')}")
PY
ts "all done"

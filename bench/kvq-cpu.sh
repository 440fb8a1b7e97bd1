#!/bin/sh
# kvq-cpu.sh — decode at depth with a quantized KV cache on the CPU (issue 15): cinfer with its f32 KV
# cache, KV8 and KV4 (MLX affine codes, group 64: kv_bits 8 / 4) next to llama.cpp's quantized KV
# (llama-bench -fa 1 -ctk/-ctv q8_0 and q4_0) on the same weights, in one run, with the bytes each
# step reads and the machine's read-bandwidth ceiling measured in the same run.
#
# Model: the TinyLlama-1.1B shape with max_position_embeddings raised to 16384, random f16 weights
# (bench/mk-random-model.py). cinfer runs its MLX affine 8-bit conversion (`cinfer convert -q --q-bits
# 8 --q-group-size 64`, 8.5 bits per weight); llama.cpp runs Q8_0 (8.5 bits per weight) quantized by
# its own llama-quantize --pure from the GGUF of the same f16 weights (bench/hf-to-gguf.py).
# cinfer: $BUILD/bench/bench-model -d (prefill once to each depth with the f32 cache, time TG decode
# steps, restore that state into a kv_bits context with quantized_kv_start = depth, whose first step
# converts the cache, then time TG steps; best of REPS). llama.cpp: bench/llama-depth.cpp (built here
# against the peer's libraries), llama-bench's own decode steps (-fa 1, -ctk/-ctv) after a depth filled
# as SPLIT sequences that seq_cp then gives to one sequence (the same cells and kernel as llama-bench -d,
# without the hour that llama-bench's quantized-KV fill of 16k takes on 2 cores; see that file), one
# call per depth and KV type, every KV type at a depth before the next depth (mean of REPS). PEER_CHECK=D
# also runs llama-bench -p 0 -n TG -d D itself for each KV type, the check of the method at depth D.
#
# usage: bench/kvq-cpu.sh [DEPTHS] [THREADS] [TG] [REPS]     (defaults: 4096,16384 2 32 2)
#   env: BUILD (default build-cpu, built with CUDA=0), CINFER_BENCH_DIR (default /tmp/cinfer-bench; models under its kvq/), PEER_KV (default
#        "q8_0 q4_0"; add f16 for llama.cpp's f16 cache), SPLIT (default 64), PEER_CHECK (a depth; unset: none), NO_PEER=1 skips llama.cpp, NO_CINFER=1 runs
#        llama.cpp alone next to the cinfer figures and ceilings of the last run.
# Filling 16k tokens of context costs cinfer about 16 minutes of prefill on 2 cores, llama.cpp a few
# minutes a KV type: expect about 30 minutes on a quiet 2-core machine. Output: a markdown table; raw logs in
# $CINFER_BENCH_DIR/kvq/last-run/.
set -e
cd "$(dirname "$0")/.."
DEPTHS=${1:-4096,16384}
T=${2:-2}
TG=${3:-32}
REPS=${4:-2}
PEER_KV=${PEER_KV:-"q8_0 q4_0"}
WORK=${CINFER_BENCH_DIR:-/tmp/cinfer-bench}/kvq
OUT=$WORK/last-run
mkdir -p "$OUT"
B=${BUILD:-build-cpu}   # a CPU-only build folder of its own (build/ may hold CUDA objects)
make -s BUILD="$B" CUDA=0 all bench >/dev/null
SHARED=${CINFER_SHARED:-../shared}
[ -d "$SHARED/peers" ] || SHARED=/work/shared
PEER=${LLAMA_PEER_DIR:-$HOME/.cache/llama-cpp-peer}
BIN=$(sh "$SHARED/peers/llama-cpp-cpu.sh" "$PEER" | tail -1)
PLIB=$PEER/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64
[ "$BIN/llama-depth" -nt bench/llama-depth.cpp ] || g++ -O2 -std=c++17 -I"$PEER/src/include" -I"$PEER/src/ggml/include" \
  bench/llama-depth.cpp -o "$BIN/llama-depth" -L"$PLIB" -l:libllama.v0.4.0.so -l:libggml.v0.4.0.so -l:libggml-base.so \
  -pthread -Wl,-rpath,'$ORIGIN'

F16=$WORK/tl-f16 Q8=$WORK/tl-q8g64 G16=$WORK/tl-f16.gguf G8=$WORK/tl-q8_0.gguf
if [ ! -s "$F16/model.safetensors" ]; then
  /usr/bin/python3 bench/mk-random-model.py tinyllama-1.1b f16 "$F16" >/dev/null
  /usr/bin/python3 - "$F16/config.json" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1])); c["max_position_embeddings"] = 16384
json.dump(c, open(sys.argv[1], "w"), indent=2)
EOF
fi
[ -s "$Q8/model.safetensors" ] || { rm -rf "$Q8"; ./$B/cinfer convert --hf-path "$F16" --mlx-path "$Q8" -q --q-bits 8 \
  --q-group-size 64 --quiet; }
[ -s "$G16" ] || /usr/bin/python3 bench/hf-to-gguf.py "$F16" "$G16" --vocab-gguf "$PEER/src/models/ggml-vocab-llama-spm.gguf" >/dev/null
[ -s "$G8" ] || "$BIN/llama-quantize" --pure "$G16" "$G8" Q8_0 "$T" >"$OUT/quantize.log" 2>&1

echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores," \
  "flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|fma|f16c|avx512f|avx512_bf16|amx_tile)$' | tr '\n' ' ')"
echo "# load before: $(uptime | sed 's/.*load average/load average/')"
if [ -z "$NO_CINFER" ]; then
  ./$B/bench/ceilings --mb 1024 >"$OUT/ceilings.txt" 2>/dev/null
  ./$B/bench/ceilings --mb 1024 >>"$OUT/ceilings.txt" 2>/dev/null
  t0=$(date +%s)
  ./$B/bench/bench-model -m "$Q8" -t "$T" -d "$DEPTHS" -n "$TG" -r "$REPS" --kv-bits 8,4 --kv-group 64 >"$OUT/cinfer.txt"
  echo "# cinfer: $(( $(date +%s) - t0 )) s"
else   # NO_CINFER=1: the peer alone, next to the cinfer.txt and ceilings.txt of an earlier run
  ./$B/bench/ceilings --mb 1024 >>"$OUT/ceilings.txt" 2>/dev/null
fi
: >"$OUT/peer.jsonl"; : >"$OUT/peer-check.jsonl"
if [ -z "$NO_PEER" ]; then
  for d in $(echo "$DEPTHS" | tr ',' ' '); do   # every KV type at a depth before the next depth
    for kv in $PEER_KV; do
      t0=$(date +%s)
      "$BIN/llama-depth" -m "$G8" -t "$T" -n "$TG" -d "$d" -r "$REPS" -ctk "$kv" -ctv "$kv" --split "${SPLIT:-64}" \
        >>"$OUT/peer.jsonl" 2>>"$OUT/peer-$kv.log"
      echo "# llama.cpp $kv at depth $d (llama-depth, split ${SPLIT:-64}): $(( $(date +%s) - t0 )) s"
    done
  done
  if [ -n "$PEER_CHECK" ]; then   # the method against llama-bench's own fill, at one depth
    for kv in $PEER_KV; do
      t0=$(date +%s)
      "$BIN/llama-bench" -m "$G8" -t "$T" -fa 1 -p 0 -n "$TG" -d "$PEER_CHECK" -r "$REPS" -ctk "$kv" -ctv "$kv" -o jsonl \
        >>"$OUT/peer-check.jsonl" 2>>"$OUT/peer-$kv.log"
      echo "# llama-bench $kv at depth $PEER_CHECK: $(( $(date +%s) - t0 )) s"
    done
  fi
fi
./$B/bench/ceilings --mb 1024 >>"$OUT/ceilings.txt" 2>/dev/null
echo "# load after: $(uptime | sed 's/.*load average/load average/')"
/usr/bin/python3 - "$OUT" "$TG" <<'EOF'
import json, sys
out, tg = sys.argv[1], int(sys.argv[2])
kv = {}
for l in open(f"{out}/ceilings.txt"):
    k, _, v = l.partition(" ")
    try: kv[k] = max(kv.get(k, 0.0), float(v))
    except ValueError: pass
bw = kv.get("read_GBs_2t", 0.0) * 1e9
c = {}
for l in open(f"{out}/cinfer.txt"):
    k, _, v = l.strip().partition(" ")
    c[k] = v
wc = float(c["decode_bytes_per_token"])
# llama.cpp: every matrix but the token embedding table (one row a step) is read; KV per element:
# q8_0 34/32 bytes, q4_0 18/32, f16 2; 22 layers x K and V x 4 kv heads x 64
EMB = 32000 * 2048 * 34 / 32
BPE = {"q8_0": 34 / 32, "q4_0": 18 / 32, "f16": 2.0}
rows = []
depths = sorted({int(k[1:].split("_")[0]) for k in c if k.startswith("d") and k.endswith("_tok_s")})
for d in depths:
    for name, key in (("f32", "kvf32"), ("KV8 (q8, group 64)", "kvq8"), ("KV4 (q4, group 64)", "kvq4")):
        ts = c.get(f"d{d}_{key}_tg{tg}_tok_s")
        if ts is None: continue
        rows.append(("cinfer", name, d, float(ts), wc, float(c[f"d{d}_{key}_kv_bytes"])))
for f, name in (("peer.jsonl", "llama.cpp"), ("peer-check.jsonl", "llama.cpp (llama-bench -d)")):
    for l in open(f"{out}/{f}"):
        if not l.startswith("{"): continue
        r = json.loads(l)
        rows.append((name, f"{r['type_k']}/{r['type_v']}", r["n_depth"], r["avg_ts"], r["model_size"] - EMB,
                     22 * 2 * 256 * r["n_depth"] * BPE.get(r["type_k"], 0)))
print(f"read bandwidth ceiling (ceilings, 2 threads, best of 3): {bw / 1e9:.1f} GB/s")
print()
print("| engine | KV cache | context | decode tok/s | weights MB/step | KV MB/step | GB/s read | ceiling tok/s | of ceiling |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
for e, n, d, ts, w, k in sorted(rows, key=lambda r: (r[2], r[0], r[1])):
    b = w + k
    print(f"| {e} | {n} | {d} | {ts:.2f} | {w / 1e6:.0f} | {k / 1e6:.0f} | {b * ts / 1e9:.1f} | {bw / b:.1f} | {100 * ts * b / bw:.0f}% |")
pre = {k: v for k, v in c.items() if k.endswith("_prefill_s")}
print()
print("cinfer prefill (f32 cache, steps of 512): " + ", ".join(f"{k.split('_')[0]} {v} s" for k, v in pre.items()))
EOF

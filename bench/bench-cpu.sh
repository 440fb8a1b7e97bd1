#!/bin/sh
# bench-cpu.sh — cinfer's CPU prompt-processing (pp512) and decode (tg128) speed on random-weight models of
# real shapes, next to the machine's ceilings and to llama.cpp on the same shape, precision and thread
# count, all measured in this one run. Prints a markdown table (BENCHMARKS.md keeps the results).
#
# usage: bench/bench-cpu.sh [SHAPES] [DTYPES] [THREADS] [REPS]
#   defaults: "tinyllama-1.1b llama-3.2-1b" "bf16 f16" "1 2" 3
#   env: CINFER_BENCH_DIR (default /tmp/cinfer-bench: models and GGUFs, never in the repo),
#        NO_PEER=1 skips llama.cpp, PP/TG change 512/128, ROUNDS (default 2) alternations of cinfer and
#        llama.cpp per row (best of all is kept), BF16_ACT=1 adds a row with CINFER_BF16_ACT=1 (bf16 and affine types)
#        (prefill on bf16-rounded activations, AVX-512 BF16).
#        PP_ENVS="VAR=V VAR2=V2 ..." adds, per row, a prefill row for each setting run under it (e.g.
#        CINFER_BF16_ACT=0: affine prefill on f32 activations; CINFER_ISA=avx512vnni: off AMX).
#   DTYPES may name MLX affine types as qBgG (e.g. q4g64, q8g64): the bf16 model converted by `cinfer convert -q
#   --q-bits B --q-group-size G`, next to llama.cpp's QB_0 (q4g64 and Q4_0 are both 4.5 bits per weight, q8g64
#   and Q8_0 both 8.5). INT8_ACT=1 adds, for those, a decode row with CINFER_INT8_ACT=1 (the opt-in int8-activation
#   kernels; their KL is in BENCHMARKS.md).
# Steps: builds build/bench/*, runs build/bench/ceilings (read bandwidth, sgemm; twice at the start, once more
# before each row, the best so far kept; printed at the start and at the end), writes each model with
# bench/mk-random-model.py (once), runs build/bench/bench-model (best of REPS after a warm-up) and
# bench/peer-llama-cpp.sh (llama-bench -r REPS, its mean), alternating. The machine is a shared VM: its
# load and even its memory bandwidth drift, so every figure is the best of its rounds; compare with the
# ceilings printed in the same run.
set -e
cd "$(dirname "$0")/.."
SHAPES=${1:-"tinyllama-1.1b llama-3.2-1b"}
DTYPES=${2:-"bf16 f16"}
THREADS=${3:-"1 2"}
REPS=${4:-3}
PP=${PP:-512}
TG=${TG:-128}
ROUNDS=${ROUNDS:-2}
WORK=${CINFER_BENCH_DIR:-/tmp/cinfer-bench}
mkdir -p "$WORK"
make -s all bench >/dev/null
OUT=$WORK/last-run
mkdir -p "$OUT"
./build/bench/ceilings --mb 1024 >"$OUT/ceilings.txt" 2>/dev/null
./build/bench/ceilings --mb 1024 >>"$OUT/ceilings.txt" 2>/dev/null   # best of two
# best (largest) value of key $1 in file $2 ("key value" lines, several rounds)
val() { awk -v k="$1" '$1 == k { print $2 }' "$2" | sort -g | tail -1; }
row() {  # shape dtype t pp lpp gflops sgemm tg ltg gbs bw
  awk -v s="$1" -v d="$2" -v t="$3" -v pp="$4" -v lpp="$5" -v gf="$6" -v sg="$7" -v tg="$8" -v ltg="$9" \
      -v gb="${10}" -v bw="${11}" 'BEGIN {
    r1 = (lpp > 0) ? sprintf("%.2fx", pp / lpp) : "-"; r2 = (ltg > 0 && tg > 0) ? sprintf("%.2fx", tg / ltg) : "-";
    c1 = (sg > 0) ? sprintf("%.0f (%.0f%%)", gf, 100 * gf / sg) : "-";
    c2 = (bw > 0 && gb > 0) ? sprintf("%.1f (%.0f%%)", gb, 100 * gb / bw) : "-";
    printf "| %s | %s | %s | %.1f | %s | %s | %s | %s | %s | %s | %s |\n", s, d, t, pp, (lpp == "" ? "-" : lpp), r1,
      c1, (tg == "" ? "-" : tg), (ltg == "" ? "-" : ltg), r2, c2 }'
}
echo "# ceilings ($(date -u +%Y-%m-%dT%H:%MZ), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores)"
echo "# CPU features: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|fma|avx512f|avx512bw|avx512vl|avx512_vnni|avx512_bf16|avx512_fp16|amx_tile|amx_bf16|amx_int8)$' | tr '\n' ' ')"
for k in read_GBs_1t read_GBs_2t sgemm_GFLOPs_1t sgemm_GFLOPs_2x1t sgemm_GFLOPs_2t; do echo "    $k $(val $k "$OUT/ceilings.txt")"; done
echo
echo "| shape | dtype | t | cinfer pp$PP tok/s | llama.cpp pp$PP | ratio | GFLOP/s (% of sgemm) | cinfer tg$TG tok/s | llama.cpp tg$TG | ratio | GB/s (% of read bw) |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for shape in $SHAPES; do
  for dt in $DTYPES; do
    dir=$WORK/$shape-$dt
    peer=$dt
    case $dt in
    q*g*)   # MLX affine: converted from the bf16 model; the peer is llama.cpp's Q<bits>_0
      bits=${dt#q}; bits=${bits%g*}; grp=${dt#*g}; peer=q${bits}_0
      /usr/bin/python3 bench/mk-random-model.py "$shape" bf16 "$WORK/$shape-bf16" >/dev/null
      [ -s "$dir/model.safetensors" ] || { rm -rf "$dir"; ./build/cinfer convert --hf-path "$WORK/$shape-bf16" --mlx-path "$dir" -q \
          --q-bits "$bits" --q-group-size "$grp" --quiet; } ;;
    *) /usr/bin/python3 bench/mk-random-model.py "$shape" "$dt" "$dir" >/dev/null ;;
    esac
    for t in $THREADS; do
      f=$OUT/$shape-$dt-t$t.txt
      ./build/bench/ceilings --mb 1024 >>"$OUT/ceilings.txt" 2>/dev/null   # again per row: bandwidth drifts
      : >"$f"; : >"$f.peer"; : >"$f.act"; : >"$f.i8"
      for e in $PP_ENVS; do : >"$f.env-$e"; done
      # alternate cinfer and llama.cpp ROUNDS times (the machine's load and memory bandwidth drift)
      r=0
      while [ $r -lt "$ROUNDS" ]; do
        ./build/bench/bench-model -m "$dir" -t "$t" -p "$PP" -n "$TG" -r "$REPS" >>"$f"
        case $dt in bf16|q*g*) if [ -n "$BF16_ACT" ]; then
          CINFER_BF16_ACT=1 ./build/bench/bench-model -m "$dir" -t "$t" -p "$PP" -n 0 -r "$REPS" >>"$f.act"; fi ;; esac
        for e in $PP_ENVS; do env "$e" ./build/bench/bench-model -m "$dir" -t "$t" -p "$PP" -n 0 -r "$REPS" >>"$f.env-$e"; done
        case $dt in q*g*) if [ -n "$INT8_ACT" ]; then
          CINFER_INT8_ACT=1 ./build/bench/bench-model -m "$dir" -t "$t" -p 0 -n "$TG" -r "$REPS" >>"$f.i8"; fi ;; esac
        if [ -z "$NO_PEER" ]; then
          sh bench/peer-llama-cpp.sh "$shape" "$peer" "$t" "$REPS" "$PP" "$TG" >>"$f.peer" 2>/dev/null || true
        fi
        r=$((r + 1))
      done
      bw=$(val "read_GBs_${t}t" "$OUT/ceilings.txt"); [ -n "$bw" ] || bw=$(val read_GBs_2t "$OUT/ceilings.txt")
      if [ "$t" = 1 ]; then sg=$(val sgemm_GFLOPs_1t "$OUT/ceilings.txt"); else sg=$(val "sgemm_GFLOPs_${t}x1t" "$OUT/ceilings.txt"); fi
      [ -n "$sg" ] || sg=$(val sgemm_GFLOPs_2t "$OUT/ceilings.txt")
      pp=$(val "pp${PP}_tok_s" "$f"); gf=$(val "pp${PP}_GFLOP_s" "$f")
      tg=$(val "tg${TG}_tok_s" "$f"); gb=$(val "tg${TG}_GB_s" "$f")
      lpp=$(awk -v k="pp$PP" '$5 == k { print $6 }' "$f.peer" | sort -g | tail -1)
      ltg=$(awk -v k="tg$TG" '$5 == k { print $6 }' "$f.peer" | sort -g | tail -1)
      row "$shape" "$dt" "$t" "$pp" "$lpp" "$gf" "$sg" "$tg" "$ltg" "$gb" "$bw"
      if [ -s "$f.act" ]; then
        row "$shape" "$dt, bf16 activations (prefill)" "$t" "$(val "pp${PP}_tok_s" "$f.act")" "$lpp" \
            "$(val "pp${PP}_GFLOP_s" "$f.act")" "$sg" "" "" "" "$bw"
      fi
      for e in $PP_ENVS; do
        row "$shape" "$dt, $e (prefill)" "$t" "$(val "pp${PP}_tok_s" "$f.env-$e")" "$lpp" \
            "$(val "pp${PP}_GFLOP_s" "$f.env-$e")" "$sg" "" "" "" "$bw"
      done
      if [ -s "$f.i8" ]; then
        row "$shape" "$dt, int8 activations (decode)" "$t" "$pp" "$lpp" "$gf" "$sg" "$(val "tg${TG}_tok_s" "$f.i8")" "$ltg" \
            "$(val "tg${TG}_GB_s" "$f.i8")" "$bw"
      fi
    done
  done
done
echo
echo "# ceilings, best over the whole run (the rows above use the best up to their own)"
for k in read_GBs_1t read_GBs_2t sgemm_GFLOPs_1t sgemm_GFLOPs_2x1t sgemm_GFLOPs_2t; do echo "    $k $(val $k "$OUT/ceilings.txt")"; done

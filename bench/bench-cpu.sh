#!/bin/sh
# bench-cpu.sh — cinfer's CPU prompt-processing (pp512) and decode (tg128) speed on random-weight models of
# real shapes, next to the machine's ceilings and to llama.cpp on the same shape, precision and thread
# count, all measured in this one run. Prints a markdown table (BENCHMARKS.md keeps the results).
#
# usage: bench/bench-cpu.sh [SHAPES] [DTYPES] [THREADS] [REPS]
#   defaults: "tinyllama-1.1b llama-3.2-1b" "bf16 f16" "1 2" 3
#   env: CINFER_BENCH_DIR (default /tmp/cinfer-bench: models and GGUFs, never in the repo),
#        NO_PEER=1 skips llama.cpp, PP/TG change 512/128.
# Steps: builds build/bench/*, runs build/bench/ceilings (read bandwidth, sgemm), writes each model with
# bench/mk-random-model.py (once), runs build/bench/bench-model (best of REPS after a warm-up) and
# bench/peer-llama-cpp.sh (llama-bench -r REPS, its mean). The machine is shared: numbers are best-of,
# and anything else running slows them down — look at the ceilings printed in the same run.
set -e
cd "$(dirname "$0")/.."
SHAPES=${1:-"tinyllama-1.1b llama-3.2-1b"}
DTYPES=${2:-"bf16 f16"}
THREADS=${3:-"1 2"}
REPS=${4:-3}
PP=${PP:-512}
TG=${TG:-128}
WORK=${CINFER_BENCH_DIR:-/tmp/cinfer-bench}
mkdir -p "$WORK"
make -s all bench >/dev/null
OUT=$WORK/last-run
mkdir -p "$OUT"
./build/bench/ceilings --mb 1024 >"$OUT/ceilings.txt" 2>/dev/null
val() { awk -v k="$1" '$1 == k { print $2 }' "$2"; }
echo "# ceilings ($(date -u +%Y-%m-%dT%H:%MZ), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores)"
sed 's/^/    /' "$OUT/ceilings.txt"
echo
echo "| shape | dtype | t | cinfer pp$PP tok/s | llama.cpp pp$PP | ratio | GFLOP/s (% of sgemm) | cinfer tg$TG tok/s | llama.cpp tg$TG | ratio | GB/s (% of read bw) |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for shape in $SHAPES; do
  for dt in $DTYPES; do
    dir=$WORK/$shape-$dt
    /usr/bin/python3 bench/mk-random-model.py "$shape" "$dt" "$dir" >/dev/null
    for t in $THREADS; do
      f=$OUT/$shape-$dt-t$t.txt
      ./build/bench/bench-model -m "$dir" -t "$t" -p "$PP" -n "$TG" -r "$REPS" >"$f"
      if [ -z "$NO_PEER" ]; then
        sh bench/peer-llama-cpp.sh "$shape" "$dt" "$t" "$REPS" "$PP" "$TG" >"$f.peer" 2>/dev/null || true
      fi
      bw=$(val "read_GBs_${t}t" "$OUT/ceilings.txt"); [ -n "$bw" ] || bw=$(val read_GBs_2t "$OUT/ceilings.txt")
      if [ "$t" = 1 ]; then sg=$(val sgemm_GFLOPs_1t "$OUT/ceilings.txt"); else sg=$(val "sgemm_GFLOPs_${t}x1t" "$OUT/ceilings.txt"); fi
      [ -n "$sg" ] || sg=$(val sgemm_GFLOPs_2t "$OUT/ceilings.txt")
      pp=$(val "pp${PP}_tok_s" "$f"); gf=$(val "pp${PP}_GFLOP_s" "$f")
      tg=$(val "tg${TG}_tok_s" "$f"); gb=$(val "tg${TG}_GB_s" "$f")
      lpp=$(awk -v k="pp$PP" '$5 == k { print $6 }' "$f.peer" 2>/dev/null)
      ltg=$(awk -v k="tg$TG" '$5 == k { print $6 }' "$f.peer" 2>/dev/null)
      awk -v s="$shape" -v d="$dt" -v t="$t" -v pp="$pp" -v lpp="$lpp" -v gf="$gf" -v sg="$sg" \
          -v tg="$tg" -v ltg="$ltg" -v gb="$gb" -v bw="$bw" 'BEGIN {
        r1 = (lpp > 0) ? sprintf("%.2fx", pp / lpp) : "-"; r2 = (ltg > 0) ? sprintf("%.2fx", tg / ltg) : "-";
        printf "| %s | %s | %s | %.1f | %s | %s | %.0f (%.0f%%) | %.2f | %s | %s | %.1f (%.0f%%) |\n",
          s, d, t, pp, (lpp == "" ? "-" : lpp), r1, gf, 100 * gf / sg, tg, (ltg == "" ? "-" : ltg), r2, gb, 100 * gb / bw }'
    done
  done
done

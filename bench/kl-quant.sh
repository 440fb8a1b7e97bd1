#!/bin/sh
# kl-quant.sh — KL of MLX affine-quantized prose-13m against its bf16 original (issue 11, "Must be
# shown"): every recipe is written by `cinfer convert` (GPU rounding rule, as mlx_lm.convert on a
# Mac, g64 unless named) plus mlx-lm's own mixed_3_6 checkpoint, and scored by `cinfer kl` against
# the base's saved log-probs on held-out Persuasion (../shared/data/austen/persuasion.txt; prose-13m
# was not trained on it). Prints a markdown table (mean KLD, 99% KLD, same top, PPL ratio, bpw).
#
# usage: bench/kl-quant.sh [SEQ_LEN [SAMPLES [THREADS]]]     (defaults 512 16 2: 8,176 scored tokens)
# env: CINFER (default build/cinfer), CINFER_BENCH_DIR (default /tmp/cinfer-bench)
set -e
SEQ=${1:-512}
NS=${2:-16}
THREADS=${3:-2}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$HERE/..
SHARED=${CINFER_SHARED:-$ROOT/../shared}
CINFER=${CINFER:-$ROOT/build/cinfer}
WORK=${CINFER_BENCH_DIR:-/tmp/cinfer-bench}/kl-quant
BASE=$SHARED/models/prose-13m
DATA=$SHARED/data/austen/persuasion.txt
mkdir -p "$WORK"
DF="--data $DATA --sequence-length $SEQ --num-samples $NS -t $THREADS --no-progress"
[ -s "$WORK/base.lp" ] || $CINFER kl --base "$BASE" $DF --save-base "$WORK/base.lp" >/dev/null
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); flags: $(grep -m1 flags /proc/cpuinfo | grep -o 'avx2\|avx512f\|amx_tile' | sort -u | tr '\n' ' ')"
echo "| recipe | bits per weight | mean KLD | 99% KLD | same top | PPL(Q)/PPL(base) | tokens |"
echo "|---|---|---|---|---|---|---|"
row() {   # name dir
    J=$($CINFER kl --model "$2" --base-logprobs "$WORK/base.lp" -t $THREADS --no-progress --json)
    BPW=$($CINFER generate -m "$2" -p x -n 1 --json 2>/dev/null | sed 's/.*"bits_per_weight": *\([0-9.]*\).*/\1/')
    get() { echo "$J" | sed "s/.*\"$1\": \([^,}]*\).*/\1/"; }
    K99=$(echo "$J" | sed 's/.*"kld_percentiles": {"max": [^,]*, "99.9": [^,]*, "99": \([^,]*\),.*/\1/')
    awk -v n="$1" -v b="$BPW" -v k="$(get mean_kld)" -v u="$(get kld_uncertainty)" -v k99="$K99" -v st="$(get same_top)" \
        -v r="$(get ppl_ratio)" -v t="$(get tokens)" \
        'BEGIN { printf "| %s | %.3f | %.5f ± %.5f | %.4f | %.2f%% | %.4f | %d |\n", n, b, k, u, k99, 100 * st, r, t }'
}
for spec in "8 64" "6 64" "5 64" "4 64" "4 32" "4 128" "3 64" "2 64" "mixed_4_6 64" "mixed_3_6 64" "mixed_3_4 64" "mixed_2_6 64"; do
    set -- $spec
    D=$WORK/$1-g$2
    case $1 in
    mixed*) [ -d "$D" ] || $CINFER convert --hf-path "$BASE" --mlx-path "$D" -q --quant-predicate "$1" --q-group-size "$2" --quiet ;;
    *) [ -d "$D" ] || $CINFER convert --hf-path "$BASE" --mlx-path "$D" -q --q-bits "$1" --q-group-size "$2" --quiet ;;
    esac
    row "$1-bit g$2" "$D" | sed 's/mixed_\([0-9]_[0-9]\)-bit/mixed_\1/'
done
row "mixed_3_6 (mlx-lm's file, CPU rule)" "$SHARED/models/prose-13m-mlx-mixed-3-6"

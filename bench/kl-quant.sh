#!/bin/sh
# kl-quant.sh — what quantization costs prose-13m, scored by `cinfer kl` against the base's saved
# log-probs on held-out Persuasion (../shared/data/austen/persuasion.txt; prose-13m was not trained
# on it). Prints a markdown table.
#   weights (issue 11): MLX affine-quantized weights against the bf16 original: every recipe written
#     by `cinfer convert` (GPU rounding rule, as mlx_lm.convert on a Mac, g64 unless named) plus
#     mlx-lm's own mixed_3_6 checkpoint (mean KLD, 99% KLD, same top, PPL ratio, bpw);
#   kv (issue 15): the same model with its KV cache quantized (--kv-bits, from token 0 as mlx-lm's
#     QuantizedKVCache) against the unquantized cache: the unfused port (mlx-lm's quantized SDPA) at
#     8/6/5/4/3/2 bits and OptiQ's tiled port at 8/4 bits, g64 unless named, with `cinfer perplexity`.
#
# usage: bench/kl-quant.sh [weights|kv] [SEQ_LEN [SAMPLES [THREADS]]]   (defaults weights 512 16 2: 8,176 tokens)
# env: CINFER (default build/cinfer), CINFER_BENCH_DIR (default /tmp/cinfer-bench)
set -e
MODE=weights
case $1 in weights|kv) MODE=$1; shift ;; esac
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
row() {   # name dir
    J=$($CINFER kl --model "$2" --base-logprobs "$WORK/base.lp" -t $THREADS --no-progress --json)
    BPW=$($CINFER generate -m "$2" -p x -n 1 --json 2>/dev/null | sed 's/.*"bits_per_weight": *\([0-9.]*\).*/\1/')
    get() { echo "$J" | sed "s/.*\"$1\": \([^,}]*\).*/\1/"; }
    K99=$(echo "$J" | sed 's/.*"kld_percentiles": {"max": [^,]*, "99.9": [^,]*, "99": \([^,]*\),.*/\1/')
    awk -v n="$1" -v b="$BPW" -v k="$(get mean_kld)" -v u="$(get kld_uncertainty)" -v k99="$K99" -v st="$(get same_top)" \
        -v r="$(get ppl_ratio)" -v t="$(get tokens)" \
        'BEGIN { printf "| %s | %.3f | %.5f ± %.5f | %.4f | %.2f%% | %.4f | %d |\n", n, b, k, u, k99, 100 * st, r, t }'
}
if [ "$MODE" = kv ]; then
    PB=$($CINFER perplexity -m "$BASE" $DF --json | sed 's/.*"perplexity": \([^,}]*\).*/\1/')
    echo "unquantized KV (f32): perplexity $PB"
    echo "| KV cache | kernels | KV bytes / f32 | mean KLD | 99% KLD | same top | perplexity | PPL(Q)/PPL(f32) | tokens |"
    echo "|---|---|---|---|---|---|---|---|---|"
    for spec in "8 64 unfused" "6 64 unfused" "5 64 unfused" "4 64 unfused" "4 32 unfused" "3 64 unfused" "2 64 unfused" \
                "8 64 tiled" "4 64 tiled"; do
        set -- $spec
        Q="--kv-bits $1 --kv-group-size $2 --kv-kernels $3"
        J=$($CINFER kl --model "$BASE" --base-logprobs "$WORK/base.lp" $Q -t $THREADS --no-progress --json)
        P=$($CINFER perplexity -m "$BASE" $DF $Q --json | sed 's/.*"perplexity": \([^,}]*\).*/\1/')
        get() { echo "$J" | sed "s/.*\"$1\": \([^,}]*\).*/\1/"; }
        K99=$(echo "$J" | sed 's/.*"kld_percentiles": {"max": [^,]*, "99.9": [^,]*, "99": \([^,]*\),.*/\1/')
        # bytes per (head, position) of K or V: hd*bits/8 codes + 2 f32 per group, against hd*4
        awk -v b="$1" -v g="$2" -v kk="$3" -v k="$(get mean_kld)" -v u="$(get kld_uncertainty)" -v k99="$K99" \
            -v st="$(get same_top)" -v p="$P" -v pb="$PB" -v t="$(get tokens)" \
            'BEGIN { printf "| %d-bit g%d | %s | %.4f | %.3e ± %.1e | %.3e | %.2f%% | %.4f | %.5f | %d |\n", b, g, kk,
                     (64 * b / 8 + 2 * 4 * 64 / g) / (64 * 4), k, u, k99, 100 * st, p, p / pb, t }'
    done
    exit 0
fi
echo "| recipe | bits per weight | mean KLD | 99% KLD | same top | PPL(Q)/PPL(base) | tokens |"
echo "|---|---|---|---|---|---|---|"
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

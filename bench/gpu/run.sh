#!/bin/sh
# The CUDA benchmark on the GPU machine, one call: bench-cuda (built here by
# tests/gpu/build.sh, carried in build-gpu/) on random-weight llama-3.2-1b and
# llama-3-8b shapes in bf16, each next to its measured ceilings, the 8B
# shape's aggregate and long-context decode (bench-cuda BENCH_AGG/BENCH_LONG), then the
# PyTorch + transformers peer on the same shapes (eager, then
# cache_implementation="static", each under a time limit), and a Markdown
# table of all of it. Output: $OUT/bench.log, $OUT/results.jsonl.
cd "$(dirname "$0")/../.." || exit 1
B=${B:-build-gpu}
O=${OUT:-/tmp}
W=${WORK:-/tmp/cinfer-bench}
SHAPES=${SHAPES-"llama-3.2-1b llama-3-8b"}   # SHAPES="": none of these (e.g. GEMMA alone)
mkdir -p $W
if ldd $B/bench-cuda | grep -q 'not found'; then
  lib=$(find /usr/local /opt /usr/lib -name 'libcublas.so.13' 2>/dev/null | head -1)
  [ -n "$lib" ] && export LD_LIBRARY_PATH="$(dirname "$lib"):$LD_LIBRARY_PATH"
fi
export PYTHONUNBUFFERED=1
: >$O/results.jsonl
for s in $SHAPES; do
  echo "== bench-cuda $s" | tee -a $O/bench.log
  $B/bench-cuda $s $W/$s 2048 128 2>&1 | tee -a $O/bench.log | grep '^{' >>$O/results.jsonl
done
# the 8B shape's aggregate decode (N sequences decoding together) and long-context decode (MODES=0: skip)
if [ "${MODES:-1}" = 1 ]; then
  echo "== bench-cuda llama-3-8b BENCH_AGG=\"${AGG:-1 8 32 64}\" BENCH_LONG=\"${LONG:-4096 32768 131000}\"" | tee -a $O/bench.log
  BENCH_ONLY=1 BENCH_AGG="${AGG:-1 8 32 64}" BENCH_LONG="${LONG:-4096 32768 131000}" $B/bench-cuda llama-3-8b $W/llama-3-8b 2048 64 2>&1 |
    tee -a $O/bench.log | grep '^{' >>$O/results.jsonl
fi
if [ "${PDL_COMPARE:-1}" = 1 ]; then
  s=llama-3-8b
  echo "== bench-cuda $s with CINFER_CUDA_PDL=0 (programmatic dependent launch off, for comparison)" | tee -a $O/bench.log
  CINFER_CUDA_PDL=0 $B/bench-cuda $s $W/$s 2048 128 2>&1 | grep -E '^(prefill|decode)' | tee -a $O/bench.log
fi
# the Gemma-3-4B shape (issue 17; GEMMA=0: skip): prefill/decode next to torch eager, and the KV
# bytes held at 32k tokens of context (sliding layers keep their window) against every layer whole,
# next to transformers' own DynamicCache at the same context
if [ "${GEMMA:-1}" = 1 ]; then
  s=gemma-3-4b
  echo "== bench-cuda $s BENCH_LONG=32768" | tee -a $O/bench.log
  BENCH_LONG=32768 $B/bench-cuda $s $W/$s 2048 128 2>&1 | tee -a $O/bench.log | grep '^{' >>$O/results.jsonl
  for mode in eager kv; do
    n=2048; [ $mode = kv ] && n=32768
    echo "== peer torch $mode $s $n" | tee -a $O/bench.log
    timeout ${PEER_TIMEOUT:-200} python3 bench/gpu/peer-torch.py $W/$s $mode $n 128 >$O/peer.tmp 2>&1
    echo "rc=$?" >>$O/peer.tmp
    grep -vE 'Warning|warn\(' $O/peer.tmp | tail -5 | tee -a $O/bench.log
    grep '^{' $O/peer.tmp >>$O/results.jsonl
  done
fi
for mode in eager static; do
  for s in $SHAPES; do
    echo "== peer torch $mode $s" | tee -a $O/bench.log
    timeout ${PEER_TIMEOUT:-200} python3 bench/gpu/peer-torch.py $W/$s $mode 2048 128 >$O/peer.tmp 2>&1
    echo "rc=$?" >>$O/peer.tmp
    grep -vE 'Warning|warn\(' $O/peer.tmp | tail -5 | tee -a $O/bench.log
    grep '^{' $O/peer.tmp >>$O/results.jsonl
  done
done
rm -f $O/peer.tmp
python3 bench/gpu/peer-torch.py table $O/results.jsonl | tee -a $O/bench.log

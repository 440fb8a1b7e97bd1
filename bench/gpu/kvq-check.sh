#!/bin/sh
# Issue 15's quantized decode on tensor cores (k_kvq_tc, kvquant.cu) on the GPU machine, one call:
# binaries built here by tests/gpu/build.sh, carried in B (default build-gpu; or an untarred copy).
#   PART=tests: the kvq cases through k_kvq_tc (CINFER_CUDA_DEC_TC=1) with PACK, then without
#               (CINFER_CUDA_KQ_PACK=0), and every attention case through the 16-bit tensor-core kernel
#               (dec-tc.cuh is shared); then
#   PART=32k:   decode after 32768 tokens, Llama-3-8B bf16 shape with Llama-3.1's context: bf16, KV4,
#               KV8, each with the CUDA-core split kernel, then k_kvq_tc in one process
#               (BENCH_KVQ_AB=CINFER_CUDA_DEC_TC), and KV4 with PACK off / on; then
#   PART=128k:  the same at 131000 tokens (bf16 and KV4: each row prefills 131k tokens, 50-90 s).
#   PART=table: issue 15's table with the defaults (quantized pools on tensor cores at every span, 16-bit ones from
#               8192 keys): 128k bf16 and KV4 first (the ratio goal), 32k bf16/KV8/KV4, 4k with
#               BENCH_KVQ_AB=CINFER_CUDA_DEC_TC (each pool's split kernel against its tensor-core one), 128k KV8
#               (kvq-table.log, ~5 min on an H100);
#   PART=ncu:   one k_kvq_tc launch at 32k KV4 under Nsight Compute, if the machine has ncu (ncu.txt: issue
#               efficiency, warp stalls, occupancy).
# PART=all (default) runs the first three in that order; logs in $OUT (tests.log, kvq-32k.log, kvq-128k.log).
# Fails (exit 1) on a FAIL line or a failing program in the tests.
# Carrying the binaries (two unstripped ones and the tracked tree pass the 64 MiB a call takes): here,
#   sh tests/gpu/build.sh; mkdir -p /tmp/bn .carry; cp build-gpu/bench-cuda build-gpu/test-backend-ops /tmp/bn;
#   strip /tmp/bn/*; tar -C /tmp -cJf .carry/bn.tar.xz bn          (~4.5 MB)
# device (carry .carry/bn.tar.xz): tar -C /tmp -xJf .carry/bn.tar.xz && B=/tmp/bn sh bench/gpu/kvq-check.sh
# (PART=tests and PART=32k take ~3 minutes on an H100; PART=128k another ~3).
cd "$(dirname "$0")/../.." || exit 1
B=${B:-build-gpu}
O=${OUT:-/tmp}
PART=${PART:-all}
if ldd $B/bench-cuda | grep -q 'not found'; then
  lib=$(find /usr/local /opt /usr/lib -name 'libcublas.so.13' 2>/dev/null | head -1)
  [ -n "$lib" ] && export LD_LIBRARY_PATH="$(dirname "$lib"):$LD_LIBRARY_PATH"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee -a $O/tests.log
fails=0
if [ "$PART" = tests ] || [ "$PART" = all ]; then
  export CINFER_TEST_DEVICE=cuda   # test-backend-ops tests the CPU backend without it
  for e in "CINFER_CUDA_DEC_TC=1 CINFER_TEST_ONLY=kvq" "CINFER_CUDA_DEC_TC=1 CINFER_CUDA_KQ_PACK=0 CINFER_TEST_ONLY=kvq" \
           "CINFER_CUDA_DEC_TC=1 CINFER_TEST_ONLY=attention"; do
    echo "== $e" >>$O/tests.log
    env $e timeout 120 $B/test-backend-ops >>$O/tests.log 2>&1 || fails=$((fails + 1))
  done
  grep -E '^(FAIL|==)|passed' $O/tests.log
fi
long() {   # context, log, then bench-cuda's environment
  P=$1; L=$O/$2; shift 2
  echo "== $* BENCH_KVQ=$P $(date -u +%T)" >>$L
  env BENCH_ONLY=1 BENCH_KVQ=$P "$@" $B/bench-cuda llama-3.1-8b ${WORK:-/tmp/b31} 2048 48 >>$L 2>&1
}
if [ "$PART" = 32k ] || [ "$PART" = all ]; then
  long 32768 kvq-32k.log BENCH_KVQ_BITS="4 8" BENCH_KVQ_AB=CINFER_CUDA_DEC_TC
  long 32768 kvq-32k.log BENCH_KVQ_BITS=4 BENCH_KVQ_BF16=0 CINFER_CUDA_DEC_TC=1 BENCH_KVQ_AB=CINFER_CUDA_KQ_PACK
  grep -E '^==|^long-context|bf16-KV|^A/B' $O/kvq-32k.log | cut -c1-300
fi
if [ "$PART" = 128k ] || [ "$PART" = all ]; then
  long 131000 kvq-128k.log BENCH_KVQ_BITS=4 CINFER_CUDA_DEC_TC=1
  grep -E '^==|^long-context|bf16-KV|^A/B' $O/kvq-128k.log | cut -c1-300
fi
if [ "$PART" = table ]; then
  long 131000 kvq-table.log BENCH_KVQ_BITS=4
  long 32768 kvq-table.log
  long 4096 kvq-table.log BENCH_KVQ_AB=CINFER_CUDA_DEC_TC
  long 131000 kvq-table.log BENCH_KVQ_BITS=8 BENCH_KVQ_BF16=0
  grep -E '^==|^long-context|^A/B|^KV[48] at' $O/kvq-table.log | cut -c1-300
fi
if [ "$PART" = ncu ]; then
  NCU=$(command -v ncu || find /usr/local /opt -name ncu -type f 2>/dev/null | head -1)
  [ -n "$NCU" ] && env BENCH_ONLY=1 BENCH_KVQ=32768 BENCH_KVQ_BITS=4 BENCH_KVQ_BF16=0 $NCU --kernel-name regex:kvq_tc \
    --launch-skip 64 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section InstructionStats \
    --section Occupancy --section SchedulerStats --section MemoryWorkloadAnalysis \
    $B/bench-cuda llama-3.1-8b ${WORK:-/tmp/b31} 2048 4 >$O/ncu.txt 2>&1
  grep -E 'Duration|Throughput|Executed Ipc|Issue Slots|Warp Cycles Per Issued|Achieved Occupancy|No Eligible|Stall' \
    $O/ncu.txt 2>/dev/null | head -40
fi
[ $fails -eq 0 ] && ! grep -q '^FAIL' $O/tests.log 2>/dev/null

#!/bin/sh
# Builds build-trace/ (tests/gpu/build.sh's binaries) with the kernels' block timeline compiled in (-DCINFER_CUDA_TRACE;
# cuda.cuh's CU_TRACE: the ring GEMV, rope + KV write, the CUDA-core decode attention). On the device:
#   BENCH_QUANT="4 64" BENCH_PROFILE=1 BENCH_TRACE=$OUT/tr.txt build-trace/bench-cuda llama-3-8b /tmp/w 2048 128
#   python3 bench/gpu/trace-sum.py $OUT/tr.txt
cd "$(dirname "$0")/../.." && B=build-trace DEFS=-DCINFER_CUDA_TRACE exec sh tests/gpu/build.sh

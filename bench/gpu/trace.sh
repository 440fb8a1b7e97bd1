#!/bin/sh
# Builds build-trace/bench-cuda with the ring GEMV's block timeline compiled in (-DCINFER_CUDA_TRACE; see
# gemv-affine.cu's afr_trace): on the device, BENCH_QUANT="4 64" BENCH_PROFILE=1 BENCH_TRACE=$OUT/tr.txt
# build-trace/bench-cuda llama-3-8b /tmp/w 2048 128, then python3 bench/gpu/trace-sum.py $OUT/tr.txt.
set -e
cd "$(dirname "$0")/../.."
B=build-trace
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
make CUDA=1 BUILD=$B -j2 NVFLAGS="-O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Iinclude -Isrc -Xcompiler -fPIC \
 --expt-relaxed-constexpr -DCINFER_CUDA_TRACE" $B/libcinfer.a >/dev/null
[ -f build-gpu/blas-shim.o ] || sh tests/gpu/build.sh
CF="-std=c11 -O2 -g -Wall -Wextra -Werror -D_GNU_SOURCE -Iinclude -Isrc -DCINFER_CUDA=1 -DCINFER_CUDA_TRACE $(pkg-config --cflags jansson libpcre2-8 libutf8proc)"
cc $CF -I$CUDA_HOME/include -Itests -o $B/bench-cuda bench/gpu/bench-cuda.c $B/libcinfer.a build-gpu/blas-shim.o -Wl,-Bstatic -ljansson \
 -lpcre2-8 -lutf8proc -lxxhash -Wl,-Bdynamic -L$CUDA_HOME/lib64 -lcudart_static -lcublas -lcublasLt -lstdc++ -lpthread -ldl -lrt -lmvec -lm
echo "built $B/bench-cuda"

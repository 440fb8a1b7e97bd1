#!/bin/sh
# Builds the CUDA-enabled library, the cinfer CLI, the GPU tests and the GPU
# benchmark into build-gpu/ on a machine with nvcc and the Debian -dev
# packages (this one). The GPU machine has neither OpenBLAS nor jansson,
# PCRE2, utf8proc or xxHash, so those are linked statically, the CUDA runtime
# statically too, and OpenBLAS is replaced by tests/gpu/blas-shim.c (the CPU
# backend is only the reference there). Binaries then need only glibc,
# libstdc++ and the GPU machine's libcublas.
set -e
cd "$(dirname "$0")/../.."
# B (default build-gpu): the folder; DEFS: extra -D flags for the CUDA and C sources (bench/gpu/trace.sh's)
B=${B:-build-gpu}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
make CUDA=1 BUILD=$B NVDEFS="$DEFS" -j2 $B/libcinfer.a >/dev/null
CF="-std=c11 -O2 -g -Wall -Wextra -Werror -D_GNU_SOURCE -Iinclude -Isrc -DCINFER_CUDA=1 $DEFS -I/usr/include/x86_64-linux-gnu/openblas-pthread $(pkg-config --cflags jansson libpcre2-8 libutf8proc)"
LIBS="$B/libcinfer.a $B/blas-shim.o -Wl,-Bstatic -ljansson -lpcre2-8 -lutf8proc -lxxhash -Wl,-Bdynamic \
 -L$CUDA_HOME/lib64 -lcudart_static -lcublas -lcublasLt -lstdc++ -lpthread -ldl -lrt -lmvec -lm -Wl,-rpath,$CUDA_HOME/lib64"
cc $(echo $CF) -c tests/gpu/blas-shim.c -o $B/blas-shim.o
# the server needs libmicrohttpd, which the GPU machine lacks and which links statically only with
# gnutls's dependencies that Debian ships as shared objects alone: it and its non-glibc dependencies
# are copied into $B/lib, which the CLI and test-serve find through their rpath ($ORIGIN/lib)
mkdir -p $B/lib
for l in $(ldd /usr/lib/x86_64-linux-gnu/libmicrohttpd.so.12 | awk '/=>/ {print $3}' | grep -v -e '/libc.so' -e '/libm.so' -e '/libpthread'); do
  cp -L "$l" $B/lib/
done
cp -L /usr/lib/x86_64-linux-gnu/libmicrohttpd.so.12 $B/lib/
MHD="-L$B/lib -l:libmicrohttpd.so.12 -Wl,-rpath,\$ORIGIN/lib"
cc $CF -o $B/cinfer tools/cli/*.c $LIBS $MHD
for t in tests/gpu/test-*.c tests/test-backend-ops.c tests/test-cache.c tests/test-seq.c tests/test-gemma.c tests/test-sample.c \
         tests/test-serve.c bench/gpu/*.c bench/bench-ttft.c; do
  [ -f "$t" ] || continue
  cc $CF -I$CUDA_HOME/include -Itests -o $B/$(basename "$t" .c) "$t" $LIBS $MHD
done
# the standalone cuBLASLt sweep (bench/gpu/lt-sweep.cu: needs only the GPU machine's libcublas)
$CUDA_HOME/bin/nvcc -O2 -arch=sm_90 -cudart static -o $B/lt-sweep bench/gpu/lt-sweep.cu -lcublasLt -lcublas
echo "built $B: $(cd $B && ls cinfer test-* bench-* lt-sweep 2>/dev/null | tr '\n' ' ')"

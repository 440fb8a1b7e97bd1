#!/bin/sh
# pack.sh — everything tests/gpu/run.sh needs on the GPU machine in one carry: the programs built here by
# tests/gpu/build.sh (stripped) with build-gpu/lib, stories260k and prose-13m from ../shared/models, and the
# first 3,000 bytes of Emma, as one tarball at xz -9 (.carry/gpu-suite.tar.xz). One archive matters: xz's 64 MiB
# window at -9 shares the programs' common code across files (the seven test programs: 3.2 MB together, against
# ~2.3 MB each at the default level), so the suite with prose-13m (~24 MB) and the tracked tree stay under the
# 64 MiB a device call carries. Device side (carry .carry/gpu-suite.tar.xz):
#   tar -C /tmp -xJf .carry/gpu-suite.tar.xz && B=/tmp/gpu-suite/bin MODELS=/tmp/gpu-suite/models COMMIT=<rev> \
#     OUT=$OUT sh tests/gpu/run.sh
# EXTRA="bench-cuda ..." adds more programs from $B to bin/ (they share the archive's window).
# (run.sh takes TXT from $MODELS/../austen-3k.txt; COMMIT: the device gets no .git.)
set -e
cd "$(dirname "$0")/../.."
B=${B:-build-gpu}
SHARED=${CINFER_SHARED:-../shared}
P=$(mktemp -d)
S=$P/gpu-suite
mkdir -p "$S/bin" "$S/models"
for t in cinfer test-backend-ops test-cache test-cuda-model test-gemma test-sample test-seq test-serve $EXTRA; do
  [ -x "$B/$t" ] || { echo "pack.sh: $B/$t missing (sh tests/gpu/build.sh)" >&2; exit 1; }
  cp "$B/$t" "$S/bin/" && strip "$S/bin/$t"
done
cp -r "$B/lib" "$S/bin/lib"
for m in stories260k prose-13m; do cp -r "$SHARED/models/$m" "$S/models/"; done
head -c 3000 "$SHARED/data/austen/emma.txt" >"$S/austen-3k.txt"
mkdir -p .carry
tar -C "$P" -cf - gpu-suite | xz -9e -T2 >.carry/gpu-suite.tar.xz
rm -rf "$P"
echo "packed .carry/gpu-suite.tar.xz: $(du -h .carry/gpu-suite.tar.xz | cut -f1)"

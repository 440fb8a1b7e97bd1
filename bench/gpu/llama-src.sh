#!/usr/bin/env bash
# llama-src.sh — the llama.cpp build steps the H200 peer scripts share (llama-cpp-kvq.sh, llama-cpp-ppl.sh):
#   llama-src.sh unpack TAR SRC TOOL   unpack the source tarball of ../shared/peers/README.md into SRC (emptied
#                                      first) and trim tools/ to the one directory TOOL (llama-bench, perplexity)
#   llama-src.sh configure SRC LOG     configure a Release CUDA build for sm_90 in SRC/build (output to LOG)
set -u
case "${1:-}" in
unpack)
  TAR=$2 SRC=$3 TOOL=$4
  rm -rf "$SRC"; mkdir -p "$SRC"
  tar xJf "$TAR" -C "$SRC" || { echo "llama-src.sh: untar of $TAR failed"; exit 1; }
  python3 - "$SRC" "$TOOL" <<'PY'
import sys, os
src, tool = sys.argv[1], sys.argv[2]
p = os.path.join(src, 'tools/CMakeLists.txt')          # tools/: the one tool only
s = open(p).read()
open(p, 'w').write(s[:s.index('if (EMSCRIPTEN)')] + f'add_subdirectory({tool})\n')
p = os.path.join(src, 'vendor/CMakeLists.txt')         # vendor/miniaudio is not in the tarball
s = open(p).read().replace('add_subdirectory(miniaudio)\n', '')
open(p, 'w').write(s)
print(f"patched tools/CMakeLists.txt ({tool} only) and vendor/CMakeLists.txt")
PY
  ;;
configure)
  SRC=$2 LOG=$3
  FLAGS=(-G Ninja -DCMAKE_BUILD_TYPE=Release
    -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real -DGGML_CUDA_FA_ALL_QUANTS=OFF -DGGML_CUDA_NCCL=OFF
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_COMMIT=v0.4.0-src)
  echo "cmake ${FLAGS[*]}"
  cmake -S "$SRC" -B "$SRC/build" "${FLAGS[@]}" > "$LOG" 2>&1 || { tail -30 "$LOG"; echo "llama-src.sh: configure failed"; exit 1; }
  ;;
*) echo "usage: llama-src.sh unpack TAR SRC TOOL | configure SRC LOG"; exit 2 ;;
esac

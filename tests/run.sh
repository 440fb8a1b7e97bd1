#!/bin/sh
# Runs every test binary of each build folder given (default: build) from the
# repository root, then the host-side Python checks (tests/gpu/emu-*.py), and
# prints the closing summary "N passed, N failed".
# A binary that crashes or exits non-zero without a FAIL line counts as a failure,
# and so does a tests/test-*.c whose binary is missing from a build folder.
# Every failure is said again just before the summary, so that the last lines
# of a long run (all that CI shows) name what failed.
cd "$(dirname "$0")/.." || exit 1
[ $# -eq 0 ] && set -- build
pass=0; fail=0; log=$(mktemp); fails=$(mktemp)
for b in "$@"; do
  for src in tests/test-*.c; do
    t="$b/tests/$(basename "$src" .c)"
    name="$b/$(basename "$t")"
    if [ ! -x "$t" ]; then echo "FAIL $name: not built (from $src)" | tee -a "$fails"; fail=$((fail + 1)); continue; fi
    ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 "$t" >"$log" 2>&1
    rc=$?
    p=$(grep -c '^PASS ' "$log"); f=$(grep -c '^FAIL ' "$log")
    if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then f=1; echo "FAIL $name: exited $rc without a FAIL line" | tee -a "$fails"; tail -20 "$log"; fi
    grep '^FAIL ' "$log" | sed "s|^|$name: |" | tee -a "$fails"
    [ $rc -ne 0 ] && tail -30 "$log" | grep -v '^PASS '
    echo "$name: $p passed, $f failed"
    pass=$((pass + p)); fail=$((fail + f))
  done
done
# host-side checks in Python (NumPy), once: the CUDA kernels' operand layouts emulated lane by lane
for py in tests/gpu/emu-*.py; do
  [ -f "$py" ] || continue
  /usr/bin/python3 "$py" >"$log" 2>&1   # Debian's, with python3-numpy (scripts/install-deps.sh)
  rc=$?
  p=$(grep -c '^PASS ' "$log"); f=$(grep -c '^FAIL ' "$log")
  if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then f=1; echo "FAIL $py: exited $rc without a FAIL line" | tee -a "$fails"; tail -20 "$log"; fi
  grep '^FAIL ' "$log" | sed "s|^|$py: |" | tee -a "$fails"
  echo "$py: $p passed, $f failed"
  pass=$((pass + p)); fail=$((fail + f))
done
if [ -s "$fails" ]; then echo "-- what failed:"; cut -c1-400 "$fails"; fi
rm -f "$log" "$fails"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ] && [ "$pass" -gt 0 ]

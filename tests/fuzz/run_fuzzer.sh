#!/usr/bin/env bash
# Builds the frame-decoder fuzz target with clang's libFuzzer and runs it for a bounded time.
#   run_fuzzer.sh SOURCE_DIR BUILD_DIR SECONDS
# The verdict is the fuzzer's own status: a crash, a sanitizer report or a failed property exits 1
# (libFuzzer's default for a crash is 77, which a test runner may read as "skipped").
# tests/tiers.cmake registers this test only where clang++-14 and its fuzzer runtime exist.
set -euo pipefail
src=$1 out=$2 seconds=${3:-30}
clang=$(command -v clang++-14 || command -v clang++ || true)
[[ -n "$clang" ]] || { echo "run_fuzzer: clang++ not found" >&2; exit 1; }
mkdir -p "$out/fuzz-corpus"
if ! "$clang" -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
     -I"$src/include" "$src/tests/fuzz/frame_decoder.cpp" -o "$out/fuzz_frame_decoder" 2> "$out/fuzz-build.log"; then
  cat "$out/fuzz-build.log" >&2; exit 1
fi
# Seeds: a valid header and a valid hello, so mutations start from the interesting shapes.
printf 'DTRN\x01\x00\x00\x00' > "$out/fuzz-corpus/seed-frame"
head -c 56 /dev/zero >> "$out/fuzz-corpus/seed-frame"
printf 'DTRH\x01\x00\x01\x00' > "$out/fuzz-corpus/seed-hello"
head -c 48 /dev/zero >> "$out/fuzz-corpus/seed-hello"
log="$out/fuzz-run.log"
status=0
"$out/fuzz_frame_decoder" -max_total_time="$seconds" -print_final_stats=1 -error_exitcode=1 -timeout_exitcode=1 \
  -artifact_prefix="$out/" "$out/fuzz-corpus" > "$log" 2>&1 || status=$?
if [[ $status -ne 0 ]]; then
  # The report (and the input that triggered it, saved beside the log) is what a reader needs.
  tail -n 60 "$log"
  echo "run_fuzzer: the fuzzer failed with status $status; the crashing input is under $out/" >&2
  exit 1
fi
tail -n 15 "$log"

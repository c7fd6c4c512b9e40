#!/usr/bin/env bash
# Builds the frame-decoder fuzz target with clang's libFuzzer and runs it for a bounded time.
#   run_fuzzer.sh SOURCE_DIR BUILD_DIR SECONDS
# Exit 77 (ctest: skipped) when clang or its fuzzer runtime is missing.
set -eu
src=$1 out=$2 seconds=${3:-30}
clang=$(command -v clang++-14 || command -v clang++ || true)
[[ -n "$clang" ]] || { echo "skipped: clang++ not found"; exit 77; }
mkdir -p "$out/fuzz-corpus"
if ! "$clang" -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
     -I"$src/include" "$src/tests/fuzz/frame_decoder.cpp" -o "$out/fuzz_frame_decoder" 2> "$out/fuzz-build.log"; then
  if grep -q "libclang_rt.fuzzer\|cannot find.*fuzzer" "$out/fuzz-build.log"; then
    echo "skipped: clang's libFuzzer runtime (libclang-rt-14-dev) is missing"; exit 77
  fi
  cat "$out/fuzz-build.log"; exit 1
fi
# Seeds: a valid header and a valid hello, so mutations start from the interesting shapes.
printf 'DTRN\x01\x00\x00\x00' > "$out/fuzz-corpus/seed-frame"
head -c 56 /dev/zero >> "$out/fuzz-corpus/seed-frame"
printf 'DTRH\x01\x00\x01\x00' > "$out/fuzz-corpus/seed-hello"
head -c 48 /dev/zero >> "$out/fuzz-corpus/seed-hello"
"$out/fuzz_frame_decoder" -max_total_time="$seconds" -print_final_stats=1 "$out/fuzz-corpus" 2>&1 | tail -15

#!/usr/bin/env bash
# The PyTorch backend's CUDA checks (docs/pytorch.md, "CUDA tensors"), for a host with a GPU and a
# CUDA build of torch, which CI never has. Three commands:
#
#   scripts/torch-gpu-check.sh pack DIR         # here: what the build needs beyond torch and g++
#   scripts/torch-gpu-check.sh run LOG_DIR DIR  # on the GPU host, DIR copied there
#   scripts/torch-gpu-check.sh bench LOG_DIR DIR  # there too: where a staged call's time goes
#
# `pack` copies into DIR the Boost headers dtrain_torch includes (found by the compiler, not
# guessed), OpenSSL's headers and libcrypto, for a GPU host that has Python, torch, g++ and
# ninja but no Debian packages. `run` builds dtrain_torch there with torch's own cpp_extension
# (torch's flags and ABI, no CMake needed), then runs, each under a deadline with its log in
# LOG_DIR: the CUDA staging test with 2 and 3 ranks sharing the GPU, the CPU test against Gloo,
# and DDP Fashion-MNIST on CUDA tensors over dtrain against Gloo (when $FASHION_MNIST, default
# .dev/fashion-mnist, holds the data). `bench` builds it the same way, then times all_reduce over
# dtrain and Gloo on CPU and CUDA tensors beside the staging copies alone (bench/torch_collectives.py),
# bare sockets and dtrain's collectives without torch (benches `pack` took from $BUILD), and DDP on
# CPU tensors. LOG_DIR/summary.txt lists each step's status and seconds.
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
sources=(module.cpp process_group.cpp host_staging.cpp)

pack() {
  local dir python=${PYTHON:-python3}
  dir=$(mkdir -p "$1" && cd "$1" && pwd)
  mkdir -p "$dir/include" "$dir/lib"
  local flags
  flags=$("$python" -c "import sysconfig, torch.utils.cpp_extension as e
print(' '.join(['-I' + p for p in e.include_paths()] + ['-I' + sysconfig.get_paths()['include']]))") || exit 1
  # The headers under /usr/include/boost that g++ and clang read for the module, and Boost's
  # config headers (which pick files by compiler).
  local cxx
  for cxx in g++ clang++; do
    command -v $cxx > /dev/null || continue
    (cd "$here/extensions/torch_backend" && $cxx -std=gnu++20 -DBOOST_ALL_NO_LIB $flags -I"$here/include" -M \
      "${sources[@]}" 2> /dev/null)
  done | tr ' \\' '\n\n' | grep '^/usr/include/boost/' > "$dir/boost-files.txt"
  find /usr/include/boost/config -type f >> "$dir/boost-files.txt"
  sort -u -o "$dir/boost-files.txt" "$dir/boost-files.txt"
  sed 's|^/usr/include/||' "$dir/boost-files.txt" | (cd /usr/include && xargs cp --parents -t "$dir/include")
  mkdir -p "$dir/include/openssl"
  cp /usr/include/openssl/*.h /usr/include/x86_64-linux-gnu/openssl/*.h "$dir/include/openssl/"
  cp -L /usr/lib/x86_64-linux-gnu/libcrypto.so.3 "$dir/lib/"
  # dtrain's own TCP benches, built here ($BUILD, default build): `bench` runs them there to tell
  # the transport's speed from the torch layer's. Built against an older glibc, they run on newer.
  local build=${BUILD:-build}
  if [ -x "$build/bench/bench_collectives" ] && [ -x "$build/bench/bench_tcp_ceiling" ] \
     && [ -x "$build/tools/dtrain-run" ]; then
    mkdir -p "$dir/bin"
    cp "$build/bench/bench_collectives" "$build/bench/bench_tcp_ceiling" "$build/tools/dtrain-run" "$dir/bin/"
    cp -L /usr/lib/x86_64-linux-gnu/libfmt.so.9 "$dir/lib/"
  else
    echo "pack: no benches under $build (bench_collectives, bench_tcp_ceiling, dtrain-run): bench will skip them" >&2
  fi
  du -sh "$dir"
}

source "$here/scripts/step.sh"

# describe LOG_DIR DIR: the machine's description; sets $logs and $bundle.
describe() {
  logs=$1
  bundle=$(cd "$2" && pwd)
  mkdir -p "$logs" && : > "$logs/summary.txt"
  {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"
    g++ --version | head -1
    nproc
  } > "$logs/machine.log" 2>&1
  cd "$here" || exit 1
}

# build_module: dtrain_torch built into $module with torch's cpp_extension.
build_module() {
  module=/tmp/dtrain_torch_build
  rm -rf "$module" && mkdir -p "$module"
  step build 400 env MAX_JOBS=16 python3 - "$bundle" "$module" "${sources[@]}" <<'EOF2'
import os, sys
import torch.utils.cpp_extension as ext
bundle, module, sources = sys.argv[1], sys.argv[2], sys.argv[3:]
ext.load("dtrain_torch", [os.path.join("extensions/torch_backend", s) for s in sources],
         extra_cflags=["-O2", "-std=gnu++20", "-DBOOST_ALL_NO_LIB"],
         extra_include_paths=[os.path.abspath("include"), os.path.join(bundle, "include")],
         extra_ldflags=[os.path.join(bundle, "lib", "libcrypto.so.3"), "-Wl,-rpath," + os.path.join(bundle, "lib")],
         build_directory=module)
print("built", module)
EOF2
}

run() {
  describe "$1" "$2"
  build_module
  step cuda_staging_2 240 python3 tests/torch/cuda_staging.py --ranks 2 --module-dir "$module"
  step cuda_staging_3 240 python3 tests/torch/cuda_staging.py --ranks 3 --module-dir "$module"
  step c10d_against_gloo_2 200 python3 tests/torch/c10d_against_gloo.py --ranks 2 --module-dir "$module"
  local data=${FASHION_MNIST:-.dev/fashion-mnist}
  if [ -d "$data" ]; then
    step ddp_cuda 300 python3 bench/ddp_backends.py --device cuda --module-dir "$module" --data "$data" --ranks 2 4 \
      --rounds 2 --epochs 2 --json "$logs/ddp_cuda.json"
  fi
  echo done >> "$logs/summary.txt"
}

# bench LOG_DIR DIR: where a staged step's time goes. all_reduce over dtrain and Gloo on CPU and
# CUDA tensors beside the staging copies alone; then, where `pack` bundled them, bare sockets and
# dtrain's collectives without torch; then DDP on CPU tensors, where Gloo has cores to spare.
bench() {
  describe "$1" "$2"
  if [ -x "$bundle/bin/bench_collectives" ]; then  # first: it needs no build
    step transport 200 env LD_LIBRARY_PATH="$bundle/lib" BIN="$bundle/bin" bash -c '
      set -x
      "$BIN/bench_tcp_ceiling" --sizes 1048576 16777216 --seconds 1
      for p in 2 4; do for progress in blocking spin; do
        "$BIN/dtrain-run" -n $p "$BIN/bench_collectives" --transport tcp --ops allreduce -b 1048576 -e 16777216 \
          -f 16 -t 0.5 --algorithms ring halving_doubling --progress $progress
      done; done'
  fi
  build_module
  step collectives 200 python3 bench/torch_collectives.py --module-dir "$module" --ranks 2 4 --device cpu cuda
  local data=${FASHION_MNIST:-.dev/fashion-mnist}
  if [ -d "$data" ]; then
    step ddp_cpu 300 python3 bench/ddp_backends.py --device cpu --module-dir "$module" --data "$data" --ranks 2 4 \
      --rounds 2 --epochs 2
  fi
  echo done >> "$logs/summary.txt"
}

case "${1:-}" in
  pack) pack "$2" ;;
  run) run "$2" "$3" ;;
  bench) bench "$2" "$3" ;;
  *) sed -n 2,17p "$0"; exit 2 ;;
esac

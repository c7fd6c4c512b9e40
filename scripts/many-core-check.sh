#!/usr/bin/env bash
# The many-core measurements of docs/performance.md ("On a many-core host"), for the 16-core host
# lent with a GPU, where nothing outside the host can be reached. Two commands:
#
#   scripts/many-core-check.sh pack DIR BUILD      # here: binaries, libraries, Open MPI, data
#   scripts/many-core-check.sh run LOG_DIR DIR [P...]  # there, DIR carried; P: 2 4 8 16 by default
#
# `pack` copies from BUILD (a build with DTRAIN_BENCH_NATIVE=OFF, so that the binaries run on
# another CPU) dtrain-run, bench_collectives, bench_host_reduce, mpi_allreduce, bench_ps,
# bench_tcp_ceiling, the peers' drivers it has and the Fashion-MNIST example, the shared libraries
# they load beyond glibc, this machine's Open MPI (Debian's files, relocated with OPAL_PREFIX) and
# the data set: about 61 MiB (a carry holds 64).
# `run` measures, each step under a deadline with its log in LOG_DIR and LOG_DIR/summary.txt
# listing each step's status and seconds (packed into $MANY_CORE_ARCHIVE after every step when set):
#   1. the machine, and one core's memcpy and a[i] += b[i] bandwidth (bench_host_reduce);
#   2. shared-memory allreduce against Open MPI (vader, CMA) and torch's Gloo at each P,
#      alternated, with the progress a user gets by default (bench/compare_openmpi.py --progress
#      default --peers openmpi gloo);
#   3. the default progress against blocking alone at 8 ranks, 1 KiB to 64 MiB;
#   4. the parameter server (bench_ps) against bare TCP, ZeroMQ and ps-lite at 1+1, 2+2 and 4+4
#      servers+workers (bench/ps_throughput.py); ZeroMQ's and ps-lite's drivers where BUILD has
#      them (ps-lite: configured with -DDTRAIN_PSLITE_DIR, whose tests/local.sh is packed);
#   5. the Fashion-MNIST example against DDP (Gloo; torch from $PYTHON, default python3) at P = 1
#      and each P.
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
bins=(tools/dtrain-run bench/bench_collectives bench/bench_host_reduce bench/mpi_allreduce examples/fashion_mnist
  bench/bench_ps bench/bench_tcp_ceiling)
peers=(bench/zmq_push_pull bench/pslite_push_pull)  # packed where BUILD has them

pack() {
  local dir build
  dir=$(mkdir -p "$1" && cd "$1" && pwd)
  build=$(cd "$2" && pwd)
  mkdir -p "$dir/tree/tools" "$dir/tree/bench" "$dir/tree/examples" "$dir/lib" "$dir/openmpi" "$dir/data"
  local b
  for b in "${bins[@]}"; do
    [ -x "$build/$b" ] || { echo "many-core-check: $build/$b is missing (build it first)" >&2; exit 1; }
    cp "$build/$b" "$dir/tree/$b"
  done
  for b in "${peers[@]}"; do
    if [ -x "$build/$b" ]; then cp "$build/$b" "$dir/tree/$b"; bins+=("$b"); fi
  done
  # ps-lite's launcher, from the checkout the build's pslite_push_pull was linked against.
  local pslite
  pslite=$(sed -n 's/^DTRAIN_PSLITE_DIR:PATH=//p' "$build/CMakeCache.txt")
  if [ -x "$build/bench/pslite_push_pull" ] && [ -f "$pslite/tests/local.sh" ]; then
    mkdir -p "$dir/pslite/tests" && cp "$pslite/tests/local.sh" "$dir/pslite/tests/"
    (cd "$pslite" && git rev-parse HEAD) > "$dir/pslite/commit" 2> /dev/null
  fi
  strip "$dir"/tree/*/*  # symbols: 8 MiB of the carry's 64
  # Every library the binaries and Open MPI's own libraries load, but glibc's (the host has its
  # own) and Open MPI's (below); not those of the network components a one-host run never opens
  # (UCX, libfabric, PSM, verbs), whose load errors are silenced in `run`.
  local mpi_libs
  mpi_libs=$(dpkg -L libopenmpi3 | grep '/lib/x86_64-linux-gnu/lib[^/]*\.so\.[0-9]*$')
  { for b in "${bins[@]}"; do ldd "$build/$b"; done; ldd $mpi_libs; } | awk '/=> \// {print $3}' | sort -u |
    grep -Ev '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*)\.so|/lib(mpi|open-|oshmem|mca_)' |
    grep -Ev '/lib(ucp|uct|ucs|ucm|fabric|psm|infinipath|ibverbs|rdmacm|efa|nl-)' | xargs -r cp -L -t "$dir/lib"
  # Open MPI as Debian installed it here, under DIR/openmpi/usr (OPAL_PREFIX), links kept.
  dpkg -L openmpi-bin libopenmpi3 openmpi-common | grep -Ev '^/usr/share/(man|doc)/' |
    tar -cf - --no-recursion -T - 2> /dev/null | tar -xf - -C "$dir/openmpi"
  cp "${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}"/*.gz "$dir/data/"
  (cd "$here" && git rev-parse HEAD) > "$dir/commit"
  du -sh "$dir"
  if [ "$(du -sm "$dir" | cut -f1)" -ge 64 ]; then
    echo "many-core-check: $dir is over the 64 MiB a carry holds" >&2
    exit 1
  fi
}

run() {
  local logs dir
  logs=$(mkdir -p "$1" && cd "$1" && pwd)
  dir=$(cd "$2" && pwd)
  shift 2
  local ranks=("$@")
  [ ${#ranks[@]} -gt 0 ] || ranks=(2 4 8 16)
  local summary=$logs/summary.txt
  : > "$summary"
  export OPAL_PREFIX=$dir/openmpi/usr
  export PATH=$OPAL_PREFIX/bin:$PATH
  export LD_LIBRARY_PATH=$dir/lib:$OPAL_PREFIX/lib/x86_64-linux-gnu:$OPAL_PREFIX/lib/x86_64-linux-gnu/openmpi/lib
  export OMPI_MCA_plm_rsh_agent=false  # one host: no ssh
  export OMPI_MCA_mca_base_component_show_load_errors=0  # network components without their libraries
  local tree=$dir/tree python=${PYTHON:-python3}  # the Python with torch (DDP's peer)

  source "$here/scripts/step.sh"
  archive=${MANY_CORE_ARCHIVE:-}

  {
    echo "dtrain $(cat "$dir/commit")"
    lscpu
    nproc
    free -g
    mpirun --version
    "$python" -c 'import torch; print("torch", torch.__version__)'
  } > "$logs/machine.log" 2>&1
  step host_bandwidth 60 "$tree/bench/bench_host_reduce" --json "$logs/host_bandwidth.json"
  step shm_vs_openmpi_gloo 480 python3 "$here/bench/compare_openmpi.py" --build "$tree" --path shm \
    --ranks "${ranks[@]}" --rounds 2 --progress default --peers openmpi gloo --python "$python" \
    --json "$logs/shm_vs_openmpi_gloo.json"
  step progress_default_8 90 "$tree/tools/dtrain-run" -n 8 "$tree/bench/bench_collectives" --transport shm \
    --progress default --ops allreduce -b 1024 -e $((64 << 20)) --json "$logs/progress_default_8.json"
  step progress_blocking_8 90 "$tree/tools/dtrain-run" -n 8 "$tree/bench/bench_collectives" --transport shm \
    --progress blocking --ops allreduce -b 1024 -e $((64 << 20)) --json "$logs/progress_blocking_8.json"
  # The parameter server against bare TCP, ZeroMQ and ps-lite, where packed, at 1+1, 2+2 and 4+4.
  local with_pslite=()
  [ -f "$dir/pslite/tests/local.sh" ] && with_pslite=(--pslite "$dir/pslite")
  step ps_vs_pslite 420 python3 "$here/bench/ps_throughput.py" --build "$tree" --rounds 2 --seconds 0.5 \
    --layouts 1+1 2+2 4+4 "${with_pslite[@]}" --json "$logs/ps_vs_pslite.json"
  step fashion_mnist_vs_ddp 600 python3 "$here/bench/fashion_mnist_vs_ddp.py" --build "$tree" --ranks 1 "${ranks[@]}" \
    --epochs 2 --data "$dir/data" --python "$python" --json "$logs/fashion_mnist_vs_ddp.json"
}

case "${1:-}" in
  pack) [ $# -eq 3 ] || { echo "usage: $0 pack DIR BUILD" >&2; exit 2; }; pack "$2" "$3" ;;
  run) [ $# -ge 3 ] || { echo "usage: $0 run LOG_DIR DIR [P...]" >&2; exit 2; }; shift; run "$@" ;;
  *) sed -n '2,/^set -u/p' "$0" | sed '$d'; exit 2 ;;
esac

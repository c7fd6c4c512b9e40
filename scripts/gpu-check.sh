#!/usr/bin/env bash
# Every GPU check that docs/gpu.md reports, in one run on a host with a GPU (CI has none):
#
#   scripts/gpu-check.sh BUILD_DIR LOG_DIR [ALL_REDUCE_PERF]
#
# BUILD_DIR is a CUDA build (-DDTRAIN_THRUST_DEVICE_SYSTEM=CUDA, target dtrain_gpu). Each step is
# bounded by `timeout` and logs to LOG_DIR/<step>.log; LOG_DIR/summary.txt lists every step's exit
# status and seconds. ALL_REDUCE_PERF, if given, is nccl-tests' binary, run as the peer of
# bench_device_collectives in the same run (never part of this repository).
# The data set is read from $FASHION_MNIST (default /usr/share/datasets/fashion-mnist). With
# $GPU_CHECK_ARCHIVE set, LOG_DIR is packed there after every step (what finished survives a
# cut-off run).
set -u
build=$(cd "$1" && pwd)
logs=$2
peer=${3:-}
data=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$logs"
summary=$logs/summary.txt
: > "$summary"
run=$build/tools/dtrain-run

# NCCL and cuBLAS from the toolkit, else from PyTorch's wheels where the host has only those.
for lib in libnccl.so.2 libcublas.so.13; do
  if ! ldconfig -p | grep -q "$lib" && [ ! -e "/usr/local/cuda/lib64/$lib" ]; then
    dir=$(python3 - "$lib" <<'EOF' 2>/dev/null
import glob, os, site, sys
for root in site.getsitepackages():
    for hit in glob.glob(os.path.join(root, "nvidia", "*", "lib", sys.argv[1])):
        print(os.path.dirname(hit)); sys.exit()
EOF
)
    [ -n "$dir" ] && export LD_LIBRARY_PATH=$dir:${LD_LIBRARY_PATH:-}
  fi
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}

source "$here/scripts/step.sh"
archive=${GPU_CHECK_ARCHIVE:-}

{
  nvidia-smi
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,driver_version --format=csv
  lscpu | grep -E 'Model name|^CPU\(s\)'
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  for b in "$build"/tests/test_nccl "$build"/examples/fashion_mnist_gpu; do
    ldd "$b" | grep -E 'nccl|cublas|cudart|not found'
  done
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
                                  "nccl", torch.cuda.nccl.version())'
} > "$logs/machine.log" 2>&1

# 1. Every [gpu] test, through ctest (the entries CI skips without a device).
if command -v ctest > /dev/null; then
  step gpu_tests 300 ctest --test-dir "$build" -L gpu --output-on-failure --timeout 300 \
    --repeat "until-fail:${GPU_CHECK_REPEAT:-1}"
else  # no CMake on the host: the same test programs, one process each
  for t in test_nccl test_nccl_p2p test_thrust_cuda test_staged_cuda test_device_pipeline_cuda \
           test_device_trainer_cuda test_tensor_parallel_cuda test_nccl_pipeline_cuda; do
    step "$t" 300 "$build/tests/$t"
  done
fi

# 2. Thrust reduction against device-to-device copy bandwidth, 1 MiB to 1 GiB.
step device_reduce 90 "$build/bench/bench_device_reduce" --json "$logs/device_reduce.json"

# 3. NCCL allreduce, one rank: dtrain against raw NCCL in the same run, then nccl-tests.
bdc=$build/bench/bench_device_collectives
step nccl_1_vs_raw 150 "$run" -n 1 "$bdc" --collective nccl --ops allreduce -b $((1 << 20)) -e $((1 << 30)) -f 4 \
  --peer --rounds 5 -n 50 --json "$logs/nccl_1_vs_raw.json"
if [ -n "$peer" ]; then
  step nccl_tests_all_reduce 90 "$peer" -b 1M -e 1G -f 4 -g 1 -w 5 -n 50 -c 1
fi

# 4. The example's recipe (10 epochs, batch 128, lr 0.05, momentum 0.9) over NCCL and staged, and
#    PyTorch on the same GPU as the peer.
fm=$build/examples/fashion_mnist_gpu
step fashion_mnist_gpu_nccl_1 120 "$run" -n 1 "$fm" --data "$data" --collective nccl --log-every 0
step fashion_mnist_gpu_staged_2 180 "$run" -n 2 "$fm" --data "$data" --collective staged --log-every 0
step torch_ddp_cuda_1 150 python3 "$here/bench/peers/ddp_fashion_mnist.py" --device cuda --backend nccl \
  --ranks 1 --epochs 10 --data "$data" --json "$logs/torch_ddp_cuda_1.json"

# 5. Every collective on device buffers: NCCL (one rank), TCP-staged ranks sharing the GPU, and
#    two NCCL ranks on one GPU (NCCL's answer, under dtrain's deadline).
step nccl_1_all_ops 90 "$run" -n 1 "$bdc" --collective nccl -b 1024 -e $((256 << 20)) --json "$logs/nccl_1.json"
step staged_2 120 "$run" -n 2 "$bdc" --collective staged -b 1024 -e $((64 << 20)) --json "$logs/staged_2.json"
step staged_4 90 "$run" -n 4 "$bdc" --collective staged --ops allreduce -b 1024 -e $((64 << 20)) \
  --json "$logs/staged_4.json"
# Point-to-point of device buffers (issue 47): one-way time against cudaMemcpy there and back.
step staged_sendrecv_2 60 "$run" -n 2 "$bdc" --collective staged --ops sendrecv -b 1024 -e $((64 << 20)) \
  --json "$logs/staged_sendrecv_2.json"
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then  # NCCL's point-to-point: a GPU per rank
  step nccl_sendrecv_2 60 "$run" -n 2 "$bdc" --collective nccl --ops sendrecv -b 1024 -e $((64 << 20)) \
    --json "$logs/nccl_sendrecv_2.json"
  # The model-parallel example over NCCL (its one-rank run is a ctest above): a pipeline over
  # NCCL's messages, tensor-parallel layers over its collectives, and two replicas averaging.
  for layout in pp2 tp2 dp2; do  # --pp 1 --tp 1 on two ranks: two replicas
    ways=(--pp 1 --tp 1)
    [ "$layout" = pp2 ] && ways=(--pp 2)
    [ "$layout" = tp2 ] && ways=(--tp 2)
    step "fashion_mnist_parallel_nccl_$layout" 240 "$run" -n 2 "$build/examples/fashion_mnist_parallel_device" \
      --data "$data" --comm nccl "${ways[@]}" --kernels cublas --epochs 2 --min-accuracy 0.80 --log-every 0 \
      --json "$logs/fashion_mnist_parallel_nccl_$layout.json"
  done
fi
step nccl_2_on_one_gpu 80 env NCCL_DEBUG=WARN "$run" -n 2 "$bdc" --collective nccl --ops allreduce -b $((1 << 20)) \
  -e $((1 << 20))

# 6. A rank SIGKILLed in the middle of 64 MiB allreduces: the survivors must raise, naming the
#    peer, well inside their deadline (DTRAIN_TIMEOUT_MS 10 s). NCCL needs a GPU per rank.
killed_mid_allreduce() {  # NAME COLLECTIVE RANKS
  local name=$1 collective=$2 n=$3 victim="" log=$logs/$1.log t0=$SECONDS
  DTRAIN_TIMEOUT_MS=10000 "$run" -n "$n" --keep-going "$bdc" --collective "$collective" --ops allreduce \
    -b $((64 << 20)) -e $((64 << 20)) -w 1 -n 1000000 > "$log" 2>&1 &
  local launcher=$!
  sleep 4
  for p in $(pgrep -f bench_device_collectives); do
    tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "DTRAIN_RANK=$((n - 1))" && victim=$p
  done
  local killed=$(date +%s%N)
  [ -n "$victim" ] && kill -9 "$victim"
  ( sleep 60; kill "$launcher" 2> /dev/null ) &
  wait "$launcher"
  local rc=$?
  local took_ms=$(( ($(date +%s%N) - killed) / 1000000 ))
  echo "# rank $((n - 1)) (pid ${victim:-none}) SIGKILLed 4 s in; the launcher exited $took_ms ms later, status $rc" \
    >> "$log"
  printf '%-28s rc=%-4s %4ss\n' "$name" "$rc" "$((SECONDS - t0))" | tee -a "$summary"
  if [ -n "${GPU_CHECK_ARCHIVE:-}" ]; then tar -czf "$GPU_CHECK_ARCHIVE" -C "$logs" .; fi
}
killed_mid_allreduce killed_staged_2 staged 2
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then killed_mid_allreduce killed_nccl_2 nccl 2; fi

echo "done" >> "$summary"
if [ -n "${GPU_CHECK_ARCHIVE:-}" ]; then tar -czf "$GPU_CHECK_ARCHIVE" -C "$logs" .; fi

#!/bin/sh
# The model-parallel example on device memory (Thrust's CPP system: the CPU) trains as the host
# example does: the same network, data order, schedule and layout (4 processes, 2 pipeline stages
# of 2-way tensor-parallel layers), so every progress line's mean loss must agree within 1e-3
# relative (the two differ only in rounding: Eigen's products against Thrust's per-element sums).
# Both runs must end with status 0; the lines are the reporting rank's, found in each output.
#   fashion_mnist_parallel_device_matches_host.sh <dtrain-run> <fashion_mnist_parallel> <..._device>
set -u
flags="--pp 2 --tp 2 --hidden 256,256,256 --epochs 1 --limit-train 4096 --log-every 4"
losses() {  # binary -> one mean loss per progress line
  out=$(timeout 240 "$1" -n 4 "$2" $flags 2>&1)
  code=$?
  if [ $code -ne 0 ]; then
    echo "FAIL: $2 exited with status $code: $out" >&2; return 1
  fi
  printf '%s\n' "$out" | sed -n 's/.*step *[0-9]*  loss \([0-9.]*\) .*/\1/p'
}
host=$(losses "$1" "$2") || exit 1
device=$(losses "$1" "$3") || exit 1
lines=$(printf '%s\n' "$host" | grep -c .)
if [ "$lines" -ne 8 ] || [ "$(printf '%s\n' "$device" | grep -c .)" -ne 8 ]; then
  echo "FAIL: want 8 progress lines from each (32 steps, one every 4): host [$host], device [$device]"; exit 1
fi
printf '%s\n' "$host" > /tmp/dtrain-mp-host.$$
printf '%s\n' "$device" | paste /tmp/dtrain-mp-host.$$ - | awk '
  { d = $1 - $2; if (d < 0) d = -d; if (d > 1e-3 * $1) { bad = 1; print "FAIL: line " NR ": host " $1 ", device " $2 } }
  END { exit bad }'
status=$?
rm -f /tmp/dtrain-mp-host.$$
if [ $status -ne 0 ]; then exit 1; fi
echo "ok: 8 progress lines agree within 1e-3: host [$(echo $host)], device [$(echo $device)]"

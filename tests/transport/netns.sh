#!/usr/bin/env bash
# Ranks in separate network namespaces, joined through a bridge by veth pairs, so every rank has
# its own address and the traffic really crosses interfaces. Needs root and a working
# `ip netns exec`; exits 77 (ctest: skipped), naming the reason, where either is missing.
#
#   netns.sh path/to/tcp_worker N
set -u
worker=$1
n=${2:-3}
tag="dt$$"
if [[ $(id -u) -ne 0 ]] || ! command -v ip >/dev/null; then
  echo "skipped: network namespaces need root and iproute2"; exit 77
fi
cleanup() {
  for ((r = 0; r < n; r++)); do ip netns del "${tag}r$r" 2>/dev/null; done
  ip link del "${tag}br" 2>/dev/null
}
trap cleanup EXIT
if ! ip netns add "${tag}r0" 2>/dev/null; then
  echo "skipped: cannot create network namespaces here"; exit 77
fi
# `ip netns exec` also needs a private mount namespace with / as a mount point it can make a slave
# (it remounts /sys): a chroot or a container without CAP_SYS_ADMIN has namespaces but not that.
# Probe it before relying on it, so that only a fault of dtrain's fails this test.
if ! probe=$(ip netns exec "${tag}r0" true 2>&1); then
  echo "skipped: 'ip netns exec' does not work here: ${probe}"; exit 77
fi
ip link add "${tag}br" type bridge && ip link set "${tag}br" up || { echo "skipped: no bridge support"; exit 77; }
for ((r = 0; r < n; r++)); do
  ns="${tag}r$r"
  [[ $r -gt 0 ]] && ip netns add "$ns"
  ip link add "${tag}h$r" type veth peer name "${tag}n$r" || { echo "skipped: no veth support"; exit 77; }
  ip link set "${tag}h$r" master "${tag}br" up
  ip link set "${tag}n$r" netns "$ns"
  ip -n "$ns" link set lo up
  ip -n "$ns" addr add "10.77.0.$((r + 1))/24" dev "${tag}n$r"
  ip -n "$ns" link set "${tag}n$r" up
done
token=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
pids=()
for ((r = 0; r < n; r++)); do
  DTRAIN_RANK=$r DTRAIN_WORLD_SIZE=$n DTRAIN_MASTER_ADDR=10.77.0.1 DTRAIN_MASTER_PORT=29400 \
  DTRAIN_TOKEN=$token DTRAIN_LOG=info DTRAIN_TIMEOUT_MS=30000 \
    ip netns exec "${tag}r$r" "$worker" conformance > "/tmp/${tag}.$r.log" 2>&1 &
  pids+=($!)
done
status=0
for ((r = 0; r < n; r++)); do wait "${pids[$r]}" || status=1; done
for ((r = 0; r < n; r++)); do
  log="/tmp/${tag}.$r.log"
  sed "s/^/[rank $r] /" "$log"
  # Each rank listened on its own namespace's address: not loopback, not every interface.
  if ! grep -q "rank $r listens on 10.77.0.$((r + 1)):" "$log"; then
    echo "rank $r did not listen on 10.77.0.$((r + 1))"; status=1
  fi
  rm -f "$log"
done
exit $status

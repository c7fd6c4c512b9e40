#!/usr/bin/env bash
# An emulated cluster on this one machine: each host is a network namespace, joined to the others
# through a bridge by a veth pair whose egress both ways is shaped by tc (a token bucket at the
# link's rate; with --delay, netem's rate and delay, where the kernel has netem), and each
# host runs its ranks, which talk to each other inside it over the namespace's own loopback-fast
# path. Starts one copy of a program per rank with dtrain's launcher environment (rank, world
# size, master address and port, a fresh token) plus DTRAIN_HOST_ID (so discover_hosts sees the
# emulated hosts) and DTRAIN_LOCAL_RANK / DTRAIN_LOCAL_WORLD_SIZE. Output is prefixed "[rank]".
# Everything it creates is removed when it exits, also after a failure or Ctrl-C.
#
#   bench/emulated_cluster.sh [--hosts 2] [--ranks-per-host 2] [--rate 1gbit] [--delay 0.2ms] \
#                             [--burst BYTES] [--gso BYTES] [--port 29600] [--mpirun] -- program [args...]
#
# --burst sets the token bucket (default 2 ms at the rate, at least 64 KiB: smooth for large
# transfers, but a message shorter than the bucket that follows an idle spell crosses at the
# bridge's speed); --gso caps the segments the veths hand to tc, which a small bucket needs
# (--burst 16384 --gso 8192 gives a strict link, as bench/validate_scale.py uses).
#
# --mpirun starts the program with Open MPI's mpirun instead, on the same namespaces (the peer in
# the same run): a hostfile names the emulated hosts, mpirun's rsh agent enters a host's
# namespace to start its daemon, the bridge gets an address (10.78.0.254) for mpirun itself, and
# MPI's traffic is TCP on the emulated network (btl tcp,self, pml ob1), as dtrain's is. (Open MPI
# 4.1's vader shared memory crashes between namespaces: mca_btl_vader_poll_handle_frag.) Idle
# MPI ranks yield the CPU (mpi_yield_when_idle), as mpirun does when it sees a node oversubscribed:
# the emulated hosts share this machine's cores.
#
# Exit status: the first failing rank's status (a rank that fails stops the others), 0 when all
# succeed, 77 where namespaces, veth, bridges or (for --delay) netem are not available (needs
# root, iproute2).
set -u
hosts=2 per_host=2 rate=1gbit delay=0 port=29600 mpirun=0 burst= gso=
while [[ $# -gt 0 ]]; do
  case $1 in
    --hosts) hosts=$2; shift 2 ;;
    --ranks-per-host) per_host=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --delay) delay=$2; shift 2 ;;
    --burst) burst=$2; shift 2 ;;
    --gso) gso=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --mpirun) mpirun=1; shift ;;
    --) shift; break ;;
    *) echo "emulated_cluster: unknown option $1" >&2; exit 2 ;;
  esac
done
[[ $# -ge 1 ]] || { echo "usage: $0 [options] -- program [args...]" >&2; exit 2; }
if [[ $(id -u) -ne 0 ]] || ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
  echo "skipped: an emulated cluster needs root, iproute2 and tc"; exit 77
fi
tag="dc$$"
pids=()
# Each rank runs in a process group of its own (setsid), so stopping a rank stops what it started.
stop_ranks() {
  for pid in "${pids[@]}"; do kill -TERM -- "-$pid" 2>/dev/null; done
}
cleanup() {
  stop_ranks
  sleep 0.2
  for pid in "${pids[@]}"; do kill -KILL -- "-$pid" 2>/dev/null; wait "$pid" 2>/dev/null; done
  for ((h = 0; h < hosts; h++)); do
    ip link del "${tag}v$h" 2>/dev/null  # takes its peer inside the namespace with it
    ip netns del "${tag}h$h" 2>/dev/null
  done
  ip link del "${tag}br" 2>/dev/null
  [[ -n ${mpidir:-} ]] && rm -rf "$mpidir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
skip() { echo "skipped: $1"; exit 77; }
# Bytes in 2 ms at a tc rate such as 100mbit, 1gbit or 10gbit (at least 64 KiB).
tc_burst() {
  local bits
  case $1 in
    *gbit) bits=$(( ${1%gbit} * 1000000000 )) ;;
    *mbit) bits=$(( ${1%mbit} * 1000000 )) ;;
    *) echo "emulated_cluster: give --rate in mbit or gbit, not $1" >&2; exit 2 ;;
  esac
  local bytes=$(( bits / 8 / 500 ))
  echo $(( bytes > 65536 ? bytes : 65536 ))
}
ip netns add "${tag}h0" 2>/dev/null || skip "cannot create network namespaces here"
probe=$(ip netns exec "${tag}h0" true 2>&1) || skip "'ip netns exec' does not work here: $probe"
ip link add "${tag}br" type bridge 2>/dev/null && ip link set "${tag}br" up || skip "no bridge support"
for ((h = 0; h < hosts; h++)); do
  ns="${tag}h$h"
  [[ $h -gt 0 ]] && ip netns add "$ns"
  ip link add "${tag}v$h" type veth peer name "${tag}e$h" 2>/dev/null || skip "no veth support"
  ip link set "${tag}v$h" master "${tag}br" up
  [[ -n $gso ]] && ip link set "${tag}v$h" gso_max_size "$gso" && ip link set "${tag}e$h" gso_max_size "$gso"
  ip link set "${tag}e$h" netns "$ns"
  ip -n "$ns" link set lo up
  ip -n "$ns" addr add "10.78.0.$((h + 1))/24" dev "${tag}e$h"
  ip -n "$ns" link set "${tag}e$h" up
  # The host's link: its egress into the bridge, and the bridge's egress towards it.
  if [[ $delay != 0 ]]; then
    tc -n "$ns" qdisc add dev "${tag}e$h" root netem rate "$rate" delay "$delay" limit 100000 2>/dev/null ||
      skip "tc netem (for --delay $delay) is not available in this kernel"
    tc qdisc add dev "${tag}v$h" root netem rate "$rate" delay "$delay" limit 100000
  else
    # A token bucket of 2 ms at the link's rate (at least 64 KiB): smooth, and no idle bursts.
    [[ -n $burst ]] || burst=$(tc_burst "$rate")
    tc -n "$ns" qdisc add dev "${tag}e$h" root tbf rate "$rate" burst "$burst" latency 50ms ||
      skip "tc tbf is not available"
    tc qdisc add dev "${tag}v$h" root tbf rate "$rate" burst "$burst" latency 50ms
  fi
done
echo "# emulated cluster: $hosts hosts x $per_host ranks; each host's link $rate, delay $delay each way"
world=$((hosts * per_host))
if [[ $mpirun -eq 1 ]]; then
  command -v mpirun >/dev/null || skip "no mpirun"
  ip addr add 10.78.0.254/24 dev "${tag}br"
  mpidir=$(mktemp -d)
  for ((h = 0; h < hosts; h++)); do echo "emulated-host-$h slots=$per_host"; done > "$mpidir/hostfile"
  # mpirun calls: agent <host> <daemon command line>; the daemon runs in that host's namespace.
  cat > "$mpidir/agent" <<AGENT
#!/bin/sh
host=\$1; shift
exec ip netns exec "${tag}h\${host#emulated-host-}" sh -c "\$*"
AGENT
  chmod +x "$mpidir/agent"
  setsid mpirun --allow-run-as-root --hostfile "$mpidir/hostfile" -np "$world" --map-by slot \
    --mca plm_rsh_agent "$mpidir/agent" --mca oob_tcp_if_include 10.78.0.0/24 \
    --mca btl_tcp_if_include 10.78.0.0/24 --mca btl tcp,self --mca pml ob1 --mca mpi_yield_when_idle 1 "$@" &
  pids+=($!)
  wait "${pids[0]}"
  exit $?
fi
token=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
for ((h = 0; h < hosts; h++)); do
  for ((l = 0; l < per_host; l++)); do
    r=$((h * per_host + l))
    setsid ip netns exec "${tag}h$h" env DTRAIN_RANK=$r DTRAIN_WORLD_SIZE=$world DTRAIN_MASTER_ADDR=10.78.0.1 \
      DTRAIN_MASTER_PORT=$port DTRAIN_TOKEN="$token" DTRAIN_HOST_ID="emulated-host-$h" DTRAIN_LOCAL_RANK=$l \
      DTRAIN_LOCAL_WORLD_SIZE=$per_host "$@" > >(sed -u "s/^/[$r] /") 2>&1 &
    pids+=($!)
  done
done
# The first rank to fail decides the status and stops the rest.
status=0
running=("${pids[@]}")
while [[ ${#running[@]} -gt 0 ]]; do
  still=()
  for pid in "${running[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then still+=("$pid"); continue; fi
    wait "$pid"
    rc=$?
    if [[ $rc -ne 0 && $status -eq 0 ]]; then
      status=$rc
      echo "emulated_cluster: a rank exited with status $rc; stopping the others" >&2
      stop_ranks
    fi
  done
  running=("${still[@]+"${still[@]}"}")
  [[ ${#running[@]} -gt 0 ]] && sleep 0.1
done
exit $status

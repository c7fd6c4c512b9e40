#!/bin/sh
# The parameter server under BSP with a fixed seed ends with the same parameters, bit for bit,
# whatever the process layout: 1 server over TCP, 2 servers over shared memory (the workers are
# then other ranks, their buffers elsewhere in memory), and 3 servers over TCP holding every shard
# twice (chain replication). The digest is FNV-1a over the bits.
#   fashion_mnist_ps_reproducible.sh <dtrain-run binary> <fashion_mnist binary>
set -u
digest() {  # <servers> <processes> <transport> [replicas]
  out=$(DTRAIN_PS_SERVERS=$1 timeout 240 "$RUN" -n "$2" "$EXAMPLE" --trainer ps --consistency bsp --transport "$3" \
          --replicas "${4:-1}" --epochs 1 --limit-train 4096 --log-every 0 2>&1)
  code=$?
  if [ $code -ne 0 ]; then
    echo "FAIL: $1 server(s) over $3 exited with status $code: $out" >&2; exit 1
  fi
  d=$(printf '%s\n' "$out" | sed -n 's/.*parameters digest \([0-9a-f]\{16\}\).*/\1/p')
  if [ -z "$d" ]; then
    echo "FAIL: $1 server(s) over $3 printed no digest: $out" >&2; exit 1
  fi
  echo "$d"
}
RUN=$1 EXAMPLE=$2
one=$(digest 1 3 tcp) || exit 1
two=$(digest 2 4 shm) || exit 1
if [ "$one" != "$two" ]; then
  echo "FAIL: 1 server over tcp ends at $one, 2 servers over shm at $two"; exit 1
fi
copies=$(digest 3 5 tcp 2) || exit 1
if [ "$one" != "$copies" ]; then
  echo "FAIL: 1 server over tcp ends at $one, 3 servers with 2 replicas each over tcp at $copies"; exit 1
fi
echo "ok: every layout ends at parameters digest $one"

#!/bin/sh
# The parameter server under BSP with a fixed seed ends with the same parameters, bit for bit,
# whatever the process layout: 1 server over TCP, 2 servers over shared memory (the workers are
# then other ranks, their buffers elsewhere in memory), 3 servers over TCP holding every shard
# twice (chain replication), and the same with server 0 (the head of the shard every slice of
# this model lives on) SIGKILLed mid-run: server 1 takes over, a standby server (rank 5) joins the
# chains server 0 was in, and the job goes on without a restart.
# A job started with more shards than servers that grows by a server mid-run ends as without.
# The digest is FNV-1a over the bits.
#   fashion_mnist_ps_reproducible.sh <dtrain-run binary> <fashion_mnist binary>
set -u
digest() {  # <servers> <processes> <transport> [replicas] [samples]
  out=$(DTRAIN_PS_SERVERS=$1 timeout 240 "$RUN" -n "$2" "$EXAMPLE" --trainer ps --consistency bsp --transport "$3" \
          --replicas "${4:-1}" --epochs 1 --limit-train "${5:-4096}" --log-every 0 2>&1)
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
# The last layout again, with a standby server, and server 0 killed once the workers have started
# training.
log=$(mktemp) && trap 'rm -f "$log"' EXIT
timeout 240 "$RUN" --keep-going --servers 3 --standby 1 -n 6 "$EXAMPLE" --trainer ps --consistency bsp --transport tcp \
  --replicas 2 --epochs 1 --limit-train 49152 --log-every 0 > "$log" 2>&1 &
job=$!
for _ in $(seq 600); do grep -q 'fashion_mnist: parameter server' "$log" && break; sleep 0.05; done
sleep 0.2
victim=""
runner=$(pgrep -P "$job")  # dtrain-run, under timeout
for p in $(pgrep -P "$runner"); do
  if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx 'DTRAIN_RANK=0'; then victim=$p; fi
done
[ -n "$victim" ] || { echo "FAIL: no rank 0 to kill: $(cat "$log")"; exit 1; }
kill -9 "$victim"
wait "$job"
code=$?
out=$(cat "$log")
killed='rank 0 was killed by signal 9 (SIGKILL); the others go on'
if [ $code -ne 137 ] || ! printf '%s\n' "$out" | grep -q "$killed"; then
  echo "FAIL: the job with server 0 killed exited with status $code" \
       "(want 137, rank 0 killed, no other failure): $out"; exit 1
fi
if printf '%s\n' "$out" | grep -q 'dtrain-run: rank [1-9]'; then
  echo "FAIL: another rank failed after server 0 was killed: $out"; exit 1
fi
if ! printf '%s\n' "$out" | grep -q '^\[5\] .*ps::server 5 holds a copy of shard 0 now'; then
  echo "FAIL: the standby server did not take server 0's place: $out"; exit 1
fi
failed_over=$(printf '%s\n' "$out" | sed -n 's/.*parameters digest \([0-9a-f]\{16\}\).*/\1/p')
long=$(digest 3 5 tcp 2 49152) || exit 1
if [ "$failed_over" != "$long" ]; then
  echo "FAIL: with server 0 killed mid-run the job ends at '$failed_over', without at $long: $out"; exit 1
fi
# Growing: 2 servers and 6 shards (64 KiB slices, so every shard holds some), and a growing
# standby (rank 4) that comes 1 s later: shards 2 and 5 move to it, and the job ends where the
# same job ends without it.
grow_run() {  # [dtrain-run options...]
  timeout 240 "$RUN" --servers 2 --standby 1 --shards 6 "$@" -n 5 "$EXAMPLE" --trainer ps --consistency bsp \
    --transport tcp --epochs 1 --limit-train 49152 --slice-kib 64 --log-every 0 2>&1
}
out=$(grow_run --growing 1 --join-after-ms 1000) || { echo "FAIL: the growing job failed: $out"; exit 1; }
for shard in 2 5; do
  if ! printf '%s\n' "$out" | grep -q "^\[4\] .*ps::server 4 heads shard $shard now"; then
    echo "FAIL: shard $shard did not move to the growing server: $out"; exit 1
  fi
done
grown=$(printf '%s\n' "$out" | sed -n 's/.*parameters digest \([0-9a-f]\{16\}\).*/\1/p')
out=$(grow_run) || { echo "FAIL: the same job without growing failed: $out"; exit 1; }
fixed=$(printf '%s\n' "$out" | sed -n 's/.*parameters digest \([0-9a-f]\{16\}\).*/\1/p')
if [ -z "$fixed" ] || [ "$grown" != "$fixed" ]; then
  echo "FAIL: the job that grew ends at '$grown', the same job without growing at '$fixed'"; exit 1
fi
echo "ok: every layout ends at parameters digest $one;" \
     "with server 0 killed mid-run (a standby taking its place) at $long, as without;" \
     "grown by a server mid-run at $grown, as without"


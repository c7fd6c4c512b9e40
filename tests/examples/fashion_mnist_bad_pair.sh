#!/bin/sh
# fashion_mnist --trainer ps refuses an algorithm under a consistency model its source does not
# define, naming the pair and where the table of pairs is, and the job ends without hanging (the
# first rank to refuse ends it, so another may be stopped before it says so too).
#   fashion_mnist_bad_pair.sh <dtrain-run binary> <fashion_mnist binary>
set -u
out=$(DTRAIN_PS_SERVERS=1 timeout 120 "$1" -n 2 "$2" --trainer ps --algorithm downpour --consistency ssp4 \
        --epochs 1 --log-every 0 2>&1)
code=$?
want="--algorithm downpour does not run under --consistency ssp4 here;"
want="$want see the table of pairs in docs/parameter_server.md"
if [ $code -eq 0 ] || [ $code -eq 124 ]; then
  echo "FAIL: exit status $code: $out"; exit 1
fi
if ! printf '%s\n' "$out" | grep -q -- "$want"; then
  echo "FAIL: no rank said '$want' in: $out"; exit 1
fi
echo "ok: the pair was refused: $out"

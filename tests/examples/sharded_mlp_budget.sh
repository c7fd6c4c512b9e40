#!/bin/sh
# sharded_mlp refuses to train where its trainer would hold more than --budget-mib on a rank: on
# 1 rank (the whole state, 16 B per parameter, 60.5 MiB, against 40) and on 4 with a 30 MiB
# budget (a quarter of the state, 15.1 MiB, plus two gathered layers and their gradients). Each
# run must end with status 4 on its own (not by the timeout), every rank saying it stopped (the
# others are not stopped for it: --keep-going), rank 0 naming a size above the budget and at least
# ZeRO's 16/P bytes per parameter, worked out here from the layer widths.
#   sharded_mlp_budget.sh <dtrain-run binary> <sharded_mlp binary>
set -u
params=$(( (784 * 1024 + 1024) + 3 * (1024 * 1024 + 1024) + (1024 * 10 + 10) ))
refused() {  # ranks budget
  out=$(timeout 120 "$1" --keep-going -n "$3" "$2" --epochs 1 --limit-train 1024 --log-every 0 --budget-mib "$4" 2>&1)
  code=$?
  if [ $code -ne 4 ]; then
    echo "FAIL: $3 rank(s), budget $4 MiB: exit status $code, not 4: $out"; exit 1
  fi
  r=0
  while [ $r -lt "$3" ]; do
    case $out in
      *"rank $r stops: over the budget"*) ;;
      *) echo "FAIL: $3 rank(s), budget $4 MiB: rank $r did not refuse: $out"; exit 1 ;;
    esac
    r=$((r + 1))
  done
  held=$(sed -n 's/.*the trainer holds \([0-9.]*\) MiB on its fullest rank.*/\1/p;T;q' <<EOF
$out
EOF
)
  least=$(awk -v n="$params" -v p="$3" 'BEGIN { printf "%.1f", 16 * n / p / 1048576 }')
  if [ -z "$held" ] || ! awk -v h="$held" -v b="$4" -v l="$least" 'BEGIN { exit !(h > b && h >= l) }'; then
    echo "FAIL: $3 rank(s), budget $4 MiB: want a size above the budget and at least $least MiB in: $out"; exit 1
  fi
  echo "ok: $3 rank(s) refused at $held MiB (budget $4, state alone $least): $out"
}
refused "$1" "$2" 1 40
refused "$1" "$2" 4 30

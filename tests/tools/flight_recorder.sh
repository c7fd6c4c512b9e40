#!/usr/bin/env bash
# The flight recorder in real processes over TCP (flight_worker.cpp): one rank goes wrong at its
# fifth world allreduce (call 4), a different rank from case to case, and dtrain-run's report must
# name that rank, that call and what the rank did instead. A clean job must report nothing.
#
#   flight_recorder.sh path/to/dtrain-run path/to/flight_worker
set -u
run=$1
worker=$2
. "$(dirname "$0")/checks.sh"
dir=$(mktemp -d) own=$(mktemp -d)
trap 'rm -rf "$out" "$err" "$dir" "$own"' EXIT
reports() { grep -qE -- "^dtrain-run:   $1" "$err"; }
never_reached() {  # never_reached RANK OTHERS: the line's start, as a regular expression
  echo "rank $1 never reached call 4 of group 'world', allreduce \(float32 sum, count 1024\), which ranks? $2 entered"
}
last_3="its last there was call 3 \(completed\)"
in_none="it was in none of its collectives when it dumped"

launch -- -n 3 "$worker" ok
expect "a clean job succeeds (status $status)" test "$status" -eq 0
expect "a clean job prints no flight report" test ! -s "$err"

# dtrain-run's own flight directory (under TMPDIR) goes after a clean job and after a failure that
# left no dump; after one with dumps it stays, where the report says.
launch TMPDIR="$own" -- -n 2 "$worker" ok
expect "own directory: a clean job leaves none (status $status)" test "$status" -eq 0 -a -z "$(ls -A "$own")"
rm -rf "${own:?}"/*
launch TMPDIR="$own" -- -n 2 /bin/false
expect "own directory: a job that failed without a dump leaves none (status $status)" \
  test "$status" -ne 0 -a -z "$(ls -A "$own")"
expect "own directory: ... though it made one there" has_err "no dump in $own/dtrain-flight-"
rm -rf "${own:?}"/*
launch TMPDIR="$own" DTRAIN_TEST_BAD_RANK=1 -- -n 2 "$worker" kill
kept=$(ls -d "$own"/dtrain-flight-* 2> /dev/null)
expect "own directory: a failed job's dumps stay where the report says" \
  test -n "$kept" -a -s "$kept/flight.0.txt" -a "$(grep -c -F -- "dumps in $kept)" "$err")" -eq 1

# Rank 2 asks itself for a dump mid-job (SIGUSR2), finds its 8 calls in it, and goes on.
launch DTRAIN_TEST_BAD_RANK=2 -- -n 3 "$worker" ask
expect "ask: the dump signal does not stop the job, and the dump holds the calls (status $status)" test "$status" -eq 0

# Rank 1 returns from main instead of calling allreduce 4: the others wait, then lose it.
launch DTRAIN_TEST_BAD_RANK=1 -- -n 3 "$worker" skip
expect "skip: the job fails (status $status)" test "$status" -ne 0
expect "skip: rank 1 and call 4 are named, and that rank 1 exited" \
  reports "$(never_reached 1 '0, 2'); $last_3; $in_none.*it exited with status 0$"

# Rank 2 passes 512 floats where the others pass 1024.
launch DTRAIN_TEST_BAD_RANK=2 -- -n 3 "$worker" size
expect "size: the job fails (status $status)" test "$status" -ne 0
expect "size: the first disagreement is call 4, rank 2's count against the others'" \
  reports "call 4 of group 'world': the ranks disagree: rank 2 calls allreduce \(float32 sum, count 512\);\
 ranks 0, 1 call allreduce \(float32 sum, count 1024\)$"

# Rank 1 aborts in user code: its fatal-signal handler dumps before it dies.
launch DTRAIN_TEST_BAD_RANK=1 -- -n 3 "$worker" abort
expect "abort: the job fails (status $status)" test "$status" -ne 0
expect "abort: dtrain-run saw rank 1 abort" has_err "rank 1 was killed by signal 6 (SIGABRT)"
expect "abort: rank 1 died after call 3, before call 4" \
  reports "$(never_reached 1 '0, 2'); $last_3; it died \(signal SIGABRT\)$"

# Rank 2 is SIGKILLed: it leaves no dump; the others' dumps and its exit say enough.
launch DTRAIN_TEST_BAD_RANK=2 -- -n 3 "$worker" kill
expect "kill: the job fails (status $status)" test "$status" -ne 0
expect "kill: rank 2 never reached call 4 and left no record" \
  reports "$(never_reached 2 '0, 1'); it left no flight record \(it was killed by signal 9 \(SIGKILL\)\)$"

# Rank 1 sleeps in user code past the collectives' 3 s deadline: the others time out and fail;
# dtrain-run asks rank 1 for its dump before stopping it. Rank 1 ignores SIGTERM, so the dump can
# only be the one asked for, and SIGKILL ends it after --grace-ms.
launch DTRAIN_TEST_BAD_RANK=1 DTRAIN_TIMEOUT_MS=3000 DTRAIN_TEST_SLEEP_S=60 -- -n 3 --grace-ms 500 "$worker" sleep
expect "sleep: the job fails (status $status)" test "$status" -ne 0
expect "sleep: stopped after the deadline, not after the sleep (${elapsed_ms} ms)" test "$elapsed_ms" -lt 30000
expect "sleep: rank 1 was in user code, not in a collective, when asked" \
  reports "$(never_reached 1 '0, 2'); $last_3; $in_none, [0-9.]+ s after its last one ended \(user code\);\
 it was killed by signal 9 \(SIGKILL\)$"

# Messages, no collective: rank 1 sleeps before its third send; rank 2 waits for it in vain (3 s),
# gives up and fails; dtrain-run asks rank 1 for its dump while it sleeps.
launch DTRAIN_TEST_BAD_RANK=1 DTRAIN_TIMEOUT_MS=3000 DTRAIN_TEST_SLEEP_S=60 -- -n 3 --grace-ms 500 "$worker" message
expect "message: the job fails (status $status)" test "$status" -ne 0
expect "message: stopped after the deadline, not after the sleep (${elapsed_ms} ms)" test "$elapsed_ms" -lt 30000
expect "message: rank 2's receive from rank 1, the sends rank 1 posted, and rank 1 in user code" \
  reports "rank 2 waits in receive 3 from rank 1 \(tag 7 of group 'world', 1024 float32\); rank 1 posted only 2\
 sends there; $in_none, [0-9.]+ s after its last one ended \(user code\); it was killed by signal 15 \(SIGTERM\)$"

# The same sleep with a deadline longer than the job's time limit: dtrain-run asks everyone.
launch DTRAIN_TEST_BAD_RANK=2 DTRAIN_TIMEOUT_MS=120000 DTRAIN_TEST_SLEEP_S=60 -- \
  -n 4 --time-limit 10 --grace-ms 500 --flight-dir "$dir" "$worker" sleep
expect "time limit: status 124 (got $status)" test "$status" -eq 124
expect "time limit: said" has_err "the job ran past its time limit of 10 s"
expect "time limit: rank 2 in user code, the others waiting in call 4" \
  reports "$(never_reached 2 '0, 1, 3'); $last_3; $in_none.*; it was killed by signal 9 \(SIGKILL\)$"
expect "time limit: every rank's dump is kept in --flight-dir" \
  test -s "$dir/flight.0.txt" -a -s "$dir/flight.1.txt" -a -s "$dir/flight.2.txt" -a -s "$dir/flight.3.txt"

# --analyze reads the kept dumps again; a damaged one is named, not read as a record.
"$run" --analyze "$dir" -n 4 >"$out" 2>"$err"
analyze_status=$?
expect "analyze: exit 0 (got $analyze_status)" test "$analyze_status" -eq 0
expect "analyze: the same finding" reports "$(never_reached 2 '0, 1, 3')"
echo "call id=x" >"$dir/flight.9.txt"
"$run" --analyze "$dir" -n 4 >"$out" 2>"$err"
expect "analyze: a damaged dump is named" has_err "flight.9.txt is not a dtrain flight-recorder dump"

# The directory used again: the last job's dumps (and the damaged one) are cleared first.
launch DTRAIN_TEST_BAD_RANK=1 -- -n 2 --flight-dir "$dir" "$worker" kill
expect "reused directory: only this job's two ranks are read" has_err "flight recorder (2 dumps in $dir)"
rm -f "$dir"/flight.*.txt
"$run" --analyze "$dir" >"$out" 2>"$err"
analyze_status=$?
expect "analyze: no dump is an error (status $analyze_status)" test "$analyze_status" -ne 0

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all flight-recorder checks passed"

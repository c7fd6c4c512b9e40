#!/usr/bin/env bash
# dtrain-run's own contract, which every multi-process test leans on: each rank gets its
# environment and its output lines prefixed with its rank; when one rank fails the others are
# stopped (SIGTERM, then SIGKILL after --grace-ms) and dtrain-run exits with the failed rank's
# status (128 + N for a signal), naming that rank.
#
#   dtrain_run.sh path/to/dtrain-run
set -u
run=$1
. "$(dirname "$0")/checks.sh"

# Every rank runs with its rank, world size and store; output lines carry the rank.
launch -n 3 sh -c 'echo "rank $DTRAIN_RANK of $DTRAIN_WORLD_SIZE local $DTRAIN_LOCAL_RANK" \
                        "store=${DTRAIN_STORE:+set} token=${DTRAIN_TOKEN:+set}"'
expect "all ranks succeed: exit 0" test "$status" -eq 0
for r in 0 1 2; do
  expect "rank $r's line is prefixed and has its environment" has_out "[$r] rank $r of 3 local $r store=set token=set"
done

# One rank fails while the others would run for a minute: they are stopped at once and the
# failed rank's status is dtrain-run's.
launch -n 3 sh -c 'if [ "$DTRAIN_RANK" = 1 ]; then exit 7; fi; exec sleep 60'
expect "a failing rank's status is dtrain-run's (got $status)" test "$status" -eq 7
expect "the failed rank is named" has_err "rank 1 exited with status 7"
expect "the others are stopped, not waited for (${elapsed_ms} ms)" test "$elapsed_ms" -lt 10000

# A rank killed by a signal: 128 + the signal.
launch -n 2 sh -c 'if [ "$DTRAIN_RANK" = 0 ]; then kill -KILL $$; fi; exec sleep 60'
expect "a rank killed by SIGKILL gives 137 (got $status)" test "$status" -eq 137
expect "the signal is named" has_err "rank 0 was killed by signal 9 (SIGKILL)"

# A rank that crashes closes its sockets a moment before it can be reaped, so the peer that lost it
# may exit first: rank 2 exits 3, and once dtrain-run has reaped it (its pid is gone) rank 1, which
# ignores the SIGTERM that follows, aborts. The first failure gives the status; the crash is said too.
gone=$(mktemp -u)
launch GONE="$gone" -- -n 3 --grace-ms 5000 sh -c 'ulimit -c 0; case "$DTRAIN_RANK" in
  2) echo $$ > "$GONE.tmp"; mv "$GONE.tmp" "$GONE"; exit 3;;
  1) trap "" TERM; while [ ! -s "$GONE" ] || kill -0 "$(cat "$GONE")" 2> /dev/null; do sleep 0.01; done
     kill -ABRT $$;; esac; exec sleep 60'
rm -f "$gone"
expect "a crash after a peer's failure: the first failure's status (got $status)" test "$status" -eq 3
expect "the first failure is named" has_err "rank 2 exited with status 3; stopping the other ranks"
expect "and the crash after it" has_err "dtrain-run: rank 1 was killed by signal 6 (SIGABRT) as well"
launch -n 3 sh -c 'if [ "$DTRAIN_RANK" = 1 ]; then exit 7; fi; exec sleep 60'
expect "ranks that dtrain-run stopped are not said to have crashed" test "$(grep -c 'as well' "$err")" -eq 0

# Ranks that ignore SIGTERM are killed once the grace period is over.
launch -n 3 --grace-ms 500 sh -c 'if [ "$DTRAIN_RANK" = 2 ]; then sleep 0.2; exit 5; fi; trap "" TERM; exec sleep 60'
expect "after the grace period the rest are killed; status 5 (got $status)" test "$status" -eq 5
expect "... within the grace period and a margin (${elapsed_ms} ms)" test "$elapsed_ms" -lt 10000

# A program that cannot be started.
launch -n 2 /nonexistent/program
expect "a missing program gives 127 (got $status)" test "$status" -eq 127
expect "and says which" has_err "cannot start /nonexistent/program"

# An option dtrain-run does not know, before the program, is refused, naming it; after the
# program's path it is the program's.
launch -n 2 --replicas 2 /bin/echo hi
expect "an unknown option before the program gives 2 (got $status)" test "$status" -eq 2
expect "and is named" has_err "unknown option before the program: --replicas"
expect "no rank started" test "$(grep -c 'hi' "$out")" -eq 0
launch --bogus -n 2 /bin/echo hi
expect "an unknown flag first gives 2 (got $status)" test "$status" -eq 2
expect "and is named" has_err "unknown option before the program: --bogus"
launch -n 2 /bin/echo --replicas 2 /bin/echo
expect "options after the program are its own: exit 0 (got $status)" test "$status" -eq 0
expect "and reach it unchanged" has_out "[1] --replicas 2 /bin/echo"
# (right after the program: CLI11 went on taking options it knew up to a second positional)
launch -n 1 /bin/echo --servers 1 -n 2 --time-limit 5 x --help
expect "dtrain-run's own options after the program are the program's: exit 0 (got $status)" test "$status" -eq 0
expect "and reach it unchanged" has_out "[0] --servers 1 -n 2 --time-limit 5 x --help"
launch -n 1 -- /bin/echo after --
expect "-- before the program: exit 0 (got $status)" test "$status" -eq 0
expect "and the program runs without it" has_out "[0] after --"

# Late workers of a parameter-server job: the last workers before the standby servers start
# --join-after-ms after the others, and every rank is told who is late.
launch -n 5 --servers 1 --standby 1 --late-workers 1 --join-after-ms 600 \
  sh -c 'echo "rank $DTRAIN_RANK late=$DTRAIN_PS_LATE_WORKERS ranks=$DTRAIN_LATE_RANKS at $(date +%s%3N)"'
expect "late workers: exit 0 (got $status)" test "$status" -eq 0
expect "every rank knows the late workers and late ranks" test "$(grep -c 'late=1 ranks=2 at' "$out")" -eq 5
at() { sed -n "s/^\[$1\] .* at \([0-9]*\)$/\1/p" "$out"; }
expect "the late worker (rank 3) starts 600 ms after the others ($(at 0) -> $(at 3))" \
  test $(($(at 3) - $(at 0))) -ge 550
expect "the standby (rank 4) starts with them ($(at 0) -> $(at 4))" test $(($(at 4) - $(at 0))) -lt 550

# A growing server: the first standby starts --join-after-ms after the others, the second with
# them, and every rank is told the shards, who grows and which ranks are late.
launch -n 6 --servers 2 --standby 2 --growing 1 --shards 6 --join-after-ms 600 \
  sh -c 'echo "rank $DTRAIN_RANK shards=$DTRAIN_PS_SHARDS growing=$DTRAIN_PS_GROWING" \
              "ranks=$DTRAIN_LATE_RANKS at $(date +%s%3N)"'
expect "growing: exit 0 (got $status)" test "$status" -eq 0
expect "every rank knows the shards, the growing server and the late ranks" \
  test "$(grep -c 'shards=6 growing=1 ranks=2 at' "$out")" -eq 6
expect "the growing server (rank 4) starts 600 ms after the others ($(at 0) -> $(at 4))" \
  test $(($(at 4) - $(at 0))) -ge 550
expect "the other standby (rank 5) starts with them ($(at 0) -> $(at 5))" test $(($(at 5) - $(at 0))) -lt 550

# A job that fails before its late worker's time: the worker is never started.
launch -n 3 --servers 1 --late-workers 1 --join-after-ms 5000 \
  sh -c 'if [ "$DTRAIN_RANK" = 0 ]; then exit 3; fi; echo "rank $DTRAIN_RANK started"; exec sleep 60'
expect "the failure's status is dtrain-run's (got $status)" test "$status" -eq 3
expect "the late worker never started" test "$(grep -c 'rank 2 started' "$out")" -eq 0
expect "and is not waited for (${elapsed_ms} ms)" test "$elapsed_ms" -lt 4000

echo "dtrain-run: $failures check(s) failed"
[ "$failures" -eq 0 ]

# What the launcher's shell tests share (dtrain_run.sh, flight_recorder.sh): run dtrain-run with
# its output kept, and report each check. Source it with `run` set to dtrain-run's path; it sets
# `out` and `err` (the last run's output), `status`, `elapsed_ms` and `failures`.
failures=0
out=$(mktemp) err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT

# launch [VAR=VALUE ...] [--] ARGS...: runs dtrain-run ARGS with those variables set.
launch() {
  local envs=() t0 t1
  while [[ $# -gt 0 && $1 =~ ^[A-Z_][A-Z0-9_]*= ]]; do envs+=("$1"); shift; done
  [[ ${1:-} == -- ]] && shift
  t0=$(date +%s%N)
  env "${envs[@]}" "$run" "$@" >"$out" 2>"$err"
  status=$?
  t1=$(date +%s%N)
  elapsed_ms=$(((t1 - t0) / 1000000))
}
expect() {  # expect DESCRIPTION CONDITION...
  local what=$1
  shift
  if "$@"; then
    echo "ok: $what"
  else
    echo "FAILED: $what"
    echo "--- stdout"; cat "$out"; echo "--- stderr"; cat "$err"; echo "---"
    failures=$((failures + 1))
  fi
}
has_out() { grep -qF -- "$1" "$out"; }
has_err() { grep -qF -- "$1" "$err"; }

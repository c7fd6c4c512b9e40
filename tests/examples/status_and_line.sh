#!/bin/sh
# Runs a command and passes when it exits with STATUS and its output (stdout and stderr) holds
# TEXT; it fails otherwise, and prints what came instead. A command that exits 77 where STATUS
# is not 77 exits 77 here too: ctest reads it as a skip only for a test registered as one that
# may skip (no GPU), and as a failure for any other.
#   status_and_line.sh STATUS TEXT COMMAND [ARGS...]
set -u
want=$1 text=$2
shift 2
out=$(timeout 600 "$@" 2>&1)
code=$?
if [ "$code" -eq 77 ] && [ "$want" -ne 77 ]; then
  printf '%s\n' "$out"; exit 77
fi
if [ "$code" -ne "$want" ]; then
  printf '%s\nFAIL: exit status %s, not %s\n' "$out" "$code" "$want"; exit 1
fi
if ! printf '%s' "$out" | grep -qF -- "$text"; then
  printf '%s\nFAIL: no "%s" in the output\n' "$out" "$text"; exit 1
fi
printf '%s\nok: exit status %s and "%s"\n' "$out" "$code" "$text"

#!/usr/bin/env bash
# Shows that the suite's gates can fail: each patch under tests/mutations/ breaks one property
# (its header says which) and names the ctest tests that must then fail. This script applies each
# to a scratch copy of the tree, builds what the tests need, runs them and requires a failure;
# then it takes the patch back and requires the same tests to pass again, so a failure that
# does not come from the mutation cannot count.
#
#   scripts/check_mutations.sh [--work DIR] [--quick] [NAME...]   (NAME: a patch's name, no .patch)
# --quick skips the run without the mutation (where the full suite has just passed, it halves the
# time; each mutant is still built from the tree with only its own patch applied).
#
# Patch header lines (before the diff):
#   Breaks:  what the patch breaks
#   Tests:   a ctest -R regular expression (the tests that must fail)
#   Targets: the build targets those tests need (optional; "all" builds everything)
#   Expect:  a regular expression the mutant's test output must contain (optional): the failure
#            must be the property's, not a timeout or a flake
# Takes a full build's time the first time (the scratch build is kept in --work for the next run).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=/tmp/dtrain-mutations
quick=0
names=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --work) work=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    *) names+=("$1"); shift ;;
  esac
done
if [[ ${#names[@]} -eq 0 ]]; then
  for p in "$root"/tests/mutations/*.patch; do names+=("$(basename "$p" .patch)"); done
fi
src=$work/src build=$work/build
mkdir -p "$work"
# The scratch tree: this checkout's files as they are (committed or not), without build trees.
# (tar keeps the files' times, so the scratch build recompiles only what changed since the last run)
rm -rf "$src"
mkdir -p "$src"
(cd "$root" && tar --exclude='./build*' --exclude='./.git' -cf - .) | tar -xf - -C "$src"
cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDTRAIN_FULL_SUITE=ON > "$work/configure.log"
field() { sed -n "s/^$1: *//p" "$2" | head -n 1; }
run_tests() {  # run_tests REGEX LOG: status of ctest on those tests (no test matched: 2)
  local out
  out=$(cd "$build" && ctest -R "$1" --output-on-failure --timeout 600 2>&1) && status=0 || status=$?
  printf '%s\n' "$out" > "$2"
  grep -q "No tests were found" "$2" && return 2
  # A test whose program was never built fails too, but not because of the mutation.
  grep -qE "Not Run|Could not find executable|Unable to find executable" "$2" && return 3
  return $status
}
failed=0
for name in "${names[@]}"; do
  patch=$root/tests/mutations/$name.patch
  [[ -f $patch ]] || { echo "check_mutations: no $patch" >&2; exit 2; }
  breaks=$(field Breaks "$patch") tests=$(field Tests "$patch") targets=$(field Targets "$patch")
  expect=$(field Expect "$patch")
  echo "== $name: $breaks"
  (cd "$src" && git apply --unidiff-zero "$patch")
  if [[ -n $targets ]] && ! cmake --build "$build" -j2 --target $targets > "$work/$name.build.log" 2>&1; then
    echo "   FAIL: the mutant does not build (see $work/$name.build.log)"; failed=1
    (cd "$src" && git apply -R --unidiff-zero "$patch")
    cmake --build "$build" -j2 --target $targets > "$work/$name.rebuild.log" 2>&1 || true
    continue
  fi
  status=0
  run_tests "$tests" "$work/$name.mutant.log" || status=$?
  (cd "$src" && git apply -R --unidiff-zero "$patch")
  if [[ $quick -eq 0 && -n $targets ]] \
     && ! cmake --build "$build" -j2 --target $targets > "$work/$name.rebuild.log" 2>&1; then
    echo "   FAIL: the tree does not build again without the mutation (see $work/$name.rebuild.log)"; failed=1
    continue
  fi
  if [[ -n $expect ]] && ! grep -qE -- "$expect" "$work/$name.mutant.log"; then
    echo "   FAIL: '$tests' failed, but without '$expect' (see $work/$name.mutant.log)"; failed=1; continue
  fi
  if [[ $status -eq 2 ]]; then
    echo "   FAIL: no test matches '$tests'"; failed=1; continue
  elif [[ $status -eq 3 ]]; then
    echo "   FAIL: a test's program was not built (add it to Targets; see $work/$name.mutant.log)"; failed=1; continue
  elif [[ $status -eq 0 ]]; then
    echo "   FAIL: '$tests' passed with the property broken (see $work/$name.mutant.log)"; failed=1; continue
  fi
  grep -E "^[0-9]+% tests passed|\(Failed\)|\*\*\*Failed|Exception|Timeout" "$work/$name.mutant.log" \
    | sed 's/^/   mutant: /' | head -n 8
  if [[ $quick -eq 1 ]]; then
    echo "   ok: '$tests' failed with the property broken"
    continue
  fi
  if ! run_tests "$tests" "$work/$name.restored.log"; then
    echo "   FAIL: '$tests' fails without the mutation too (see $work/$name.restored.log)"; failed=1; continue
  fi
  echo "   ok: '$tests' failed with the property broken and passes without the mutation"
done
exit $failed

# step NAME SECONDS COMMAND...: runs COMMAND under a deadline with its output in $logs/NAME.log,
# and appends its exit status and seconds to $logs/summary.txt; with $archive set, packs $logs
# there after each step (what finished survives a cut-off run). Sourced by the device scripts.
step() {
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  echo "\$ $*" > "$logs/$name.log"
  PYTHONUNBUFFERED=1 timeout --kill-after=10 "$limit" "$@" >> "$logs/$name.log" 2>&1
  local rc=$?
  printf '%-28s rc=%-4s %4ss\n' "$name" "$rc" "$((SECONDS - t0))" | tee -a "$logs/summary.txt"
  if [ -n "${archive:-}" ]; then tar -czf "$archive" -C "$logs" .; fi
}

#!/usr/bin/env python3
"""Joins the per-rank Chrome traces of one job (DTRAIN_TRACE=<prefix> writes <prefix>.<rank>.json)
into <prefix>.json, one timeline with a process per rank, for ui.perfetto.dev or chrome://tracing.

  python3 tools/merge_traces.py /tmp/run1
"""
import glob
import json
import re
import sys


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    prefix = sys.argv[1]
    files = sorted(f for f in glob.glob(glob.escape(prefix) + ".*.json") if re.fullmatch(r"\d+", f[len(prefix) + 1:-5]))
    if not files:
        sys.exit(f"no {prefix}.<rank>.json files")
    events, dropped = [], 0
    for f in files:
        with open(f) as fh:
            trace = json.load(fh)
        events += trace["traceEvents"]
        dropped += trace.get("otherData", {}).get("dropped_events", 0)
    with open(prefix + ".json", "w") as out:
        json.dump({"displayTimeUnit": "ms", "traceEvents": events, "otherData": {"dropped_events": dropped}}, out)
    print(f"{prefix}.json: {len(files)} ranks, {len(events)} events" + (f", {dropped} dropped" if dropped else ""))


if __name__ == "__main__":
    main()

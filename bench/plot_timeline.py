#!/usr/bin/python3
"""Draws a few steps of a merged dtrain trace (tools/merge_traces.py) as a timeline image: one row
per rank and thread, compute and communication in different colours, so the overlap of the
backward pass with bucket allreduces is visible without a trace viewer.

  DTRAIN_TRACE=/tmp/fm build/tools/dtrain-run -n 2 build/examples/fashion_mnist --epochs 1 --first-bucket-kib 128
  python3 tools/merge_traces.py /tmp/fm
  /usr/bin/python3 bench/plot_timeline.py /tmp/fm.json docs/images/trainer_timeline.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLOURS = {"forward+backward": "#4c72b0", "update": "#55a868", "allreduce gradients": "#dd8452",
           "wait for gradients": "#c8c8c8", "average parameters": "#8172b3"}


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    trace = json.load(open(sys.argv[1]))["traceEvents"]
    first_step, steps = (int(sys.argv[3]) if len(sys.argv) > 3 else 100), 4
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace if e.get("name") == "thread_name"}
    step_starts = sorted(e["ts"] for e in trace if e.get("ph") == "X" and e["name"] == "step" and e["pid"] == 0)
    t0, t1 = step_starts[first_step], step_starts[first_step + steps]
    rows = sorted(names)
    fig, ax = plt.subplots(figsize=(11, 0.6 + 0.55 * len(rows)))
    for y, key in enumerate(rows):
        for e in sorted(trace, key=lambda e: -e.get("dur", 0)):  # nested (shorter) events on top
            if e.get("ph") != "X" or (e["pid"], e["tid"]) != key or e["name"] == "step":
                continue
            if e["ts"] + e["dur"] < t0 or e["ts"] > t1:
                continue
            ax.broken_barh([((e["ts"] - t0) / 1000, e["dur"] / 1000)], (y - 0.35, 0.7),
                           color=COLOURS.get(e["name"], "#999999"), label=e["name"])
    ax.set_yticks(range(len(rows)), [f"rank {p} {names[(p, t)]}" for p, t in rows])
    ax.set_xlim(0, (t1 - t0) / 1000)
    ax.set_xlabel("time (ms)")
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), fontsize=8, ncol=len(unique), loc="upper center",
              bbox_to_anchor=(0.5, -0.35))
    ax.set_title(f"steps {first_step}-{first_step + steps - 1} of a 2-process run")
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)
    print(f"wrote {sys.argv[2]}")


if __name__ == "__main__":
    main()

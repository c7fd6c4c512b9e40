#!/usr/bin/python3
"""Draws one real step of each pipeline schedule, as bench_pipeline --timeline recorded it: a row
per rank, a box per forward (light) and backward (dark) coloured by micro-batch and labelled with
its number (and, interleaved, the stage), so the warm-up, the steady 1F1B phase, the flush and
the bubble are visible as they ran.

  build/tools/dtrain-run -n 4 build/bench/bench_pipeline --timeline /tmp/timeline.json --micro-batches 8 \
      --forward-us 10000
  /usr/bin/python3 bench/plot_pipeline.py /tmp/timeline.json docs/images/pipeline_schedules.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    panels = json.load(open(sys.argv[1]))
    fig, axes = plt.subplots(len(panels), 1, figsize=(12, 1.0 + 1.35 * len(panels) * panels[0]["p"] / 4), sharex=True)
    cmap = plt.get_cmap("tab10")
    for ax, panel in zip(axes, panels):
        runs = panel["runs"]
        t0 = min(r[4] for r in runs)
        span = max(r[5] for r in runs) - t0
        busy = sum(r[5] - r[4] for r in runs)
        p = panel["p"]
        for rank, stage, mb, forward, start, end in runs:
            colour = cmap(int(mb) % 10)
            ax.broken_barh([(start - t0, end - start)], (rank - 0.38, 0.76), facecolor=colour,
                           alpha=0.45 if forward else 0.95, edgecolor="white", linewidth=0.5)
            label = f"{int(mb)}" if panel["v"] == 1 else f"{int(mb)}/{int(stage)}"
            ax.text(start - t0 + (end - start) / 2, rank, label, ha="center", va="center", fontsize=6.5)
        title = panel["schedule"] + (f" (v = {panel['v']})" if panel["v"] > 1 else "")
        ax.set_title(f"{title}: p = {p}, m = {panel['m']}, step {span:.0f} ms, bubble {1 - busy / (p * span):.3f}",
                     fontsize=9, loc="left")
        ax.set_yticks(range(p), [f"rank {r}" for r in range(p)])
        ax.invert_yaxis()
        ax.grid(axis="x", alpha=0.3)
    axes[-1].set_xlabel("ms from the step's first forward (light: forward, dark: backward; label: micro-batch[/stage])")
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=130)


if __name__ == "__main__":
    main()

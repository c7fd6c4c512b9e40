#!/usr/bin/python3
"""Predicted allreduce busbw against P per algorithm, from bench/simulate_scale, into docs/images/.

One panel per (size, ranks per host): 64 KiB and 64 MiB, hosts of 1 and 8 ranks, P = 2 .. 1024.
The constants are simulate_scale's flags, e.g. the "# simulate_scale:" line a calibrated
bench_collectives --transport tcp-hosts run prints:

  /usr/bin/python3 bench/plot_scale.py --build build --out docs/images/scale_busbw.png -- \
      --alpha-local 20 --gbps-local 2.5 --alpha-cross 30 --gbps-cross 0.125 --gbps-reduce 30
"""
import argparse
import json
import subprocess
import tempfile

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SIZES = [65536, 64 << 20]
PER_HOST = [1, 8]
NAMES = {"ring": "ring", "halving_doubling": "halving-doubling", "recursive_doubling": "recursive doubling",
         "binomial_tree": "binomial tree", "double_binary_tree": "double binary tree", "hierarchical": "hierarchical"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--out", default="docs/images/scale_busbw.png")
    ap.add_argument("constants", nargs=argparse.REMAINDER, help="-- then simulate_scale's constant flags")
    args = ap.parse_args()
    flags = [f for f in args.constants if f != "--"]

    fig, axes = plt.subplots(len(SIZES), len(PER_HOST), figsize=(11, 8), sharex=True)
    for i, size in enumerate(SIZES):
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            subprocess.run([f"{args.build}/bench/simulate_scale", "-b", str(size), "-e", str(size), "--per-host",
                            ",".join(str(l) for l in PER_HOST), "--json", f.name] + flags, check=True,
                           stdout=subprocess.DEVNULL)
            rows = json.load(open(f.name))
        for j, per_host in enumerate(PER_HOST):
            ax = axes[i][j]
            for algo, label in NAMES.items():
                pts = sorted((r["ranks"], r["busbw_GBps"]) for r in rows
                             if r["algorithm"] == algo and r["per_host"] == per_host)
                if pts:
                    ax.plot([p for p, _ in pts], [b for _, b in pts], marker="o", markersize=3, label=label)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{size // 1024 if size < 1 << 20 else size >> 20} {'KiB' if size < 1 << 20 else 'MiB'}, "
                         f"{per_host} rank{'s' if per_host > 1 else ''} per host")
            ax.grid(True, which="both", alpha=0.3)
            if i == len(SIZES) - 1:
                ax.set_xlabel("P (ranks)")
            if j == 0:
                ax.set_ylabel("predicted busbw (GB/s)")
    axes[0][-1].legend(fontsize=8)  # the panel with every algorithm (two levels need L > 1)
    fig.suptitle("cluster_model: predicted float32 allreduce busbw, " + " ".join(flags), fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

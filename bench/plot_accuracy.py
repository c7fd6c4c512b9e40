#!/usr/bin/python3
"""Test accuracy against training wall time for the Fashion-MNIST example, into docs/images/.

Left: dtrain's allreduce trainer with the example's default schedule (20 epochs, cosine) at 1, 2
and 4 processes, and at 2 with fp16 compression and with local SGD (tau = 8). Right (with
--bench-json from fashion_mnist_vs_ddp.py): the 5-epoch benchmark recipe, dtrain against DDP.
Wall time counts training only (evaluation after each epoch is excluded for both).

  /usr/bin/python3 bench/plot_accuracy.py --build build --bench-json results.json
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

CONFIGS = [
    ("allreduce, 1 process", 1, []),
    ("allreduce, 2 processes", 2, []),
    ("allreduce, 4 processes", 4, []),
    ("allreduce, 2 processes, fp16 buckets", 2, ["--compress", "fp16"]),
    ("local SGD tau=8, 2 processes", 2, ["--local-sgd", "8"]),
]


def run(build, ranks, extra):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [os.path.join(build, "tools", "dtrain-run"), "-n", str(ranks),
               os.path.join(build, "examples", "fashion_mnist"), "--log-every", "0", "--json", out.name] + extra
        subprocess.run(cmd, check=True, stdout=sys.stderr)
        return json.load(open(out.name))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build")
    p.add_argument("--bench-json", default="")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "images",
                                                 "fashion_mnist_accuracy.png"))
    p.add_argument("--results", default="", help="also write the curves as JSON")
    p.add_argument("--reuse", default="", help="draw the left panel from a --results file instead of running")
    args = p.parse_args()

    panels = 2 if args.bench_json else 1
    fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 4.5), squeeze=False)
    left = axes[0][0]
    results = json.load(open(args.reuse)) if args.reuse else {}
    for label, ranks, extra in CONFIGS:
        r = results[label] if args.reuse else run(args.build, ranks, extra)
        results[label] = r
        t, a = zip(*r["curve"])
        left.plot(t, a, marker=".", label=f"{label} ({r['test_accuracy']:.3f})")
        print(f"{label}: final accuracy {r['test_accuracy']:.4f} after {t[-1]:.1f} s, "
              f"{r['samples_per_second']:.0f} samples/s")
    left.axhline(0.89, color="grey", linestyle=":", linewidth=1)
    left.set(title="dtrain, default schedule (20 epochs, cosine)", xlabel="training time (s)",
             ylabel="test accuracy", ylim=(0.80, 0.91))
    left.legend(fontsize=8, loc="lower right")
    if args.bench_json:
        right = axes[0][1]
        for i, row in enumerate(json.load(open(args.bench_json))):
            for key, style in (("dtrain", "-"), ("ddp", "--")):  # one colour per P
                r = row[key]
                t, a = zip(*r["curve"])
                right.plot(t, a, style, color=f"C{i}", marker=".",
                           label=f"{r['framework']}, {row['ranks']} process(es)")
        right.set(title="benchmark recipe (5 epochs, constant lr)", xlabel="training time (s)",
                  ylabel="test accuracy", ylim=(0.80, 0.91))
        right.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    if args.results:
        with open(args.results, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()

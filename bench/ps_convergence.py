#!/usr/bin/python3
"""Convergence of the parameter-server consistency models and worker algorithms at equal wall
time, on the Fashion-MNIST MLP (1 server, 2 workers over TCP), next to the allreduce trainer
with the same budget. Prints a table of the final test loss and accuracy (of the servers'
parameters), steps done and the servers' mean staleness; writes docs/images/ps_accuracy.png
(test accuracy of worker 0's replica after each epoch against training time).

  /usr/bin/python3 bench/ps_convergence.py --build build --seconds 12
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

# (label, algorithm, consistency, lr, extra flags)
CONFIGS = [
    ("BSP, sync SGD", "sync", "bsp", 0.05, []),
    ("SSP(1), sync SGD", "sync", "ssp1", 0.05, []),
    ("SSP(4), sync SGD", "sync", "ssp4", 0.05, []),
    ("ASP, sync SGD", "sync", "asp", 0.05, []),
    ("soft sync (2 of 2), sync SGD", "sync", "soft2", 0.05, []),
    ("Downpour (ASP, Adagrad)", "downpour", "asp", 0.02, []),
    ("ADAG (ASP, window 8)", "adag", "asp", 0.1, ["--tau", "8"]),
    ("EASGD sync (BSP, tau 8)", "easgd", "bsp", 0.1, ["--tau", "8"]),
    ("EASGD async (ASP, tau 8)", "easgd", "asp", 0.1, ["--tau", "8"]),
    ("model averaging (BSP, every 8)", "averaging", "bsp", 0.1, ["--tau", "8"]),
    ("DynSGD (ASP, window 8)", "dynsgd", "asp", 0.1, ["--tau", "8"]),
]


def run(build, args, env_extra):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        env = dict(os.environ, **env_extra)
        cmd = [os.path.join(build, "tools", "dtrain-run")] + args + ["--json", out.name]
        text = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
        result = json.load(open(out.name))
        m = re.search(r"mean staleness ([0-9.]+)", text)
        result["mean_staleness"] = float(m.group(1)) if m else 0.0
        return result


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build")
    p.add_argument("--seconds", type=float, default=12)
    p.add_argument("--json", default="")
    p.add_argument("--plot", default=os.path.join(HERE, "..", "docs", "images", "ps_accuracy.png"))
    p.add_argument("--reuse", default="", help="plot and tabulate a --json file instead of running")
    args = p.parse_args()
    example = os.path.join(args.build, "examples", "fashion_mnist")
    common = ["--log-every", "0", "--epochs", "100", "--time-budget", str(args.seconds), "--schedule", "constant"]
    rows = json.load(open(args.reuse)) if args.reuse else []
    if not rows:
        rows = measure(args, example, common)
    report(args, rows)


def measure(args, example, common):
    rows = []
    r = run(args.build, ["-n", "2", example, "--lr", "0.05"] + common, {})
    r["label"] = "allreduce trainer (2 processes)"
    rows.append(r)
    for label, algo, cons, lr, extra in CONFIGS:
        r = run(args.build, ["-n", "3", example, "--trainer", "ps", "--algorithm", algo, "--consistency", cons,
                             "--lr", str(lr)] + extra + common, {"DTRAIN_PS_SERVERS": "1"})
        r["label"] = label
        rows.append(r)
        print(f"{label}: accuracy {r['test_accuracy']:.4f}", file=sys.stderr)
    return rows


def report(args, rows):
    print(f"\nFashion-MNIST MLP, {args.seconds:g} s of training each, 2 workers (+1 server), global batch 128")
    print(f"| {'configuration':<34} | test loss | test accuracy | samples/s | mean staleness |")
    print(f"|{'-' * 36}|-----------|---------------|-----------|----------------|")
    for r in rows:
        loss = f"{r['test_loss']:.4f}" if r.get("test_loss") else "   -  "
        print(f"| {r['label']:<34} | {loss:>9} | {r['test_accuracy']:>13.4f} | {r['samples_per_second']:>9.0f} | "
              f"{r['mean_staleness']:>14.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(9, 5))
        for i, r in enumerate(rows):
            if not r["curve"]:
                continue
            t, a = zip(*r["curve"])
            ax.plot(t, a, "-" if i == 0 else "--", marker=".", color=plt.cm.tab20(i),
                    linewidth=2.5 if i == 0 else 1.2, label=f"{r['label']} ({r['test_accuracy']:.3f})")
        ax.set(title=f"Fashion-MNIST MLP: test accuracy against training time, {args.seconds:g} s each",
               xlabel="training time (s)", ylabel="test accuracy (worker 0's replica)", ylim=(0.6, 0.9))
        ax.legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)
        print(f"wrote {args.plot}", file=sys.stderr)


if __name__ == "__main__":
    main()

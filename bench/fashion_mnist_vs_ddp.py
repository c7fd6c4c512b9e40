#!/usr/bin/python3
"""dtrain's allreduce trainer against PyTorch DDP on the same Fashion-MNIST recipe, in one run.

Recipe: MLP 784-256-128-10, SGD momentum 0.9, lr 0.05 (constant), global batch 128, 5 epochs,
one thread per process, P local processes (dtrain: dtrain-run and the example's default
transport, shared memory between local ranks; DDP: gloo). For each P it prints samples/s, time
per epoch, the communication share of a step and the final test accuracy side by side, and
checks the bars from issue 4. Needs a build with the example and
the launcher, Debian's python3-torch and dataset-fashion-mnist.

  /usr/bin/python3 bench/fashion_mnist_vs_ddp.py --build build --ranks 1 2 4 --json results.json

Communication share: dtrain measures the time a step waits for its gradient buckets after the
backward pass; for DDP (whose backward returns only after its allreduce) it is
1 - (step time with no_sync) / (step time with sync), measured over 200 steps each.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def run_dtrain(build, ranks, epochs, extra, data):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [os.path.join(build, "tools", "dtrain-run"), "-n", str(ranks),
               os.path.join(build, "examples", "fashion_mnist"), "--epochs", str(epochs), "--schedule", "constant",
               "--lr", "0.05", "--batch", "128", "--log-every", "0", "--json", out.name, "--data", data] + extra
        subprocess.run(cmd, check=True, stdout=sys.stderr)
        return json.load(open(out.name))


def run_ddp(ranks, epochs, data, python):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [python, os.path.join(HERE, "peers", "ddp_fashion_mnist.py"), "--ranks", str(ranks),
               "--epochs", str(epochs), "--json", out.name, "--data", data]
        subprocess.run(cmd, check=True, stdout=sys.stderr)
        return json.load(open(out.name))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build")
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--json", default="", help="write every result here")
    p.add_argument("--dtrain-args", default="", help="extra flags for the dtrain example")
    p.add_argument("--repeat", type=int, default=1, help="runs per framework and P; the median run is reported")
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist", help="the IDX files, for both")
    p.add_argument("--python", default="/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable,
                   help="the Python with torch that runs DDP (default: Debian's)")
    args = p.parse_args()

    def median_run(runs):
        runs = sorted(runs, key=lambda r: r["samples_per_second"])
        best = dict(runs[len(runs) // 2])
        best["range"] = [runs[0]["samples_per_second"], runs[-1]["samples_per_second"]]
        return best

    rows = []
    for ranks in args.ranks:
        ds, ts = [], []
        for _ in range(args.repeat):  # interleaved, so slow spells of the machine hit both
            ds.append(run_dtrain(args.build, ranks, args.epochs, args.dtrain_args.split(), args.data))
            ts.append(run_ddp(ranks, args.epochs, args.data, args.python))
        rows.append((ranks, median_run(ds), median_run(ts)))

    print(f"\nFashion-MNIST MLP 784-256-128-10, global batch 128, lr 0.05, momentum 0.9, {args.epochs} epochs, "
          f"one thread per process, {os.cpu_count()} CPUs")
    if args.repeat > 1:
        print(f"median of {args.repeat} runs each (by samples/s); 'range' is the slowest and fastest run")
    print(f"{'P':>2} | {'framework':<12} | {'samples/s':>10} | {'range':>15} | {'s/epoch':>8} | {'comm share':>10} | "
          f"{'test acc':>8} | {'vs DDP':>6}")
    print("-" * 96)
    for ranks, d, t in rows:
        for r in (d, t):
            speed = r["samples_per_second"] / t["samples_per_second"]
            lo, hi = r["range"]
            print(f"{ranks:>2} | {r['framework']:<12} | {r['samples_per_second']:>10.0f} | {lo:>7.0f}-{hi:<7.0f} | "
                  f"{statistics.mean(r['epoch_seconds']):>8.2f} | {100 * r['communication_share']:>9.1f}% | "
                  f"{r['test_accuracy']:>8.4f} | {speed:>5.2f}x")

    by_p = {ranks: (d, t) for ranks, d, t in rows}
    checks = []
    for ranks in (2, 4):
        if ranks in by_p:
            d, t = by_p[ranks]
            ratio = d["samples_per_second"] / t["samples_per_second"]
            checks.append((f"P={ranks}: dtrain >= 2.5x DDP samples/s ({ratio:.2f}x)", ratio >= 2.5))
    if 1 in by_p and 2 in by_p:
        checks.append((f"dtrain P=2 no slower than its P=1 ({by_p[2][0]['samples_per_second']:.0f} vs "
                       f"{by_p[1][0]['samples_per_second']:.0f})",
                       by_p[2][0]["samples_per_second"] >= by_p[1][0]["samples_per_second"]))
    # The accuracy after 5 epochs at a constant rate moves by about +-0.01 with the seed (shuffle
    # order) for both frameworks; the band is DDP's lowest and highest in this run, widened by that.
    ddp_low = min(t["test_accuracy"] for _, _, t in rows)
    ddp_high = max(t["test_accuracy"] for _, _, t in rows)
    for ranks, d, _ in rows:
        checks.append((f"P={ranks}: dtrain accuracy {d['test_accuracy']:.4f} in DDP's band "
                       f"[{ddp_low:.4f}, {ddp_high:.4f}] +- 0.01",
                       ddp_low - 0.01 <= d["test_accuracy"] <= ddp_high + 0.01))
    print()
    for text, ok in checks:
        print(f"[{'pass' if ok else 'FAIL'}] {text}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"ranks": ranks, "dtrain": d, "ddp": t} for ranks, d, t in rows], f, indent=1)
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())

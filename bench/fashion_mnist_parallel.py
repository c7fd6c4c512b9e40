#!/usr/bin/python3
"""examples/fashion_mnist_parallel's layouts side by side, in one run: one process, 2 pipeline
stages, 2 stages x 2 replicas, 2-way tensor parallel x 2 replicas (and whatever --layouts names),
each the same model (MLP 784-1024-1024-1024-10 by default), recipe and number of epochs. The
layouts run in turn, in alternating order each round; the table gives each one's median
samples/s, its ratio to the one-process run, the measured bubble, and the test accuracy (of the
last round) against the one-process run's.

  /usr/bin/python3 bench/fashion_mnist_parallel.py --build build --epochs 3 --rounds 2 --json mp.json

A layout is ranks:flags, e.g. "4:--pp 2" (2 stages x 2 replicas) or "2:--pp 2 --schedule gpipe",
or torch:SCHEDULE (gpipe or 1f1b): PyTorch's torch.distributed.pipelining on the same model cut
the same way (bench/peers/torch_pipeline_fashion_mnist.py), run by --torch-python (a virtual
environment with torch >= 2.4):

  /usr/bin/python3 bench/fashion_mnist_parallel.py --epochs 1 --rounds 3 --torch-python /tmp/torch-venv/bin/python \
      --layouts "2:--pp 2 --schedule gpipe" torch:gpipe "2:--pp 2" torch:1f1b
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

LAYOUTS = ["1:", "2:--pp 2", "4:--pp 2", "4:--tp 2"]


HERE = os.path.dirname(os.path.abspath(__file__))


def run(build, layout, epochs, extra, torch_python):
    ranks, flags = layout.split(":", 1)
    if ranks == "torch":
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            cmd = [torch_python, os.path.join(HERE, "peers", "torch_pipeline_fashion_mnist.py"), "--schedule", flags,
                   "--epochs", str(epochs), "--json", out.name] + extra.split()
            subprocess.run(cmd, check=True, stdout=sys.stderr)
            return json.load(open(out.name))
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [os.path.join(build, "tools", "dtrain-run"), "-n", ranks,
               os.path.join(build, "examples", "fashion_mnist_parallel"), "--epochs", str(epochs), "--log-every", "0",
               "--json", out.name] + flags.split() + extra.split()
        subprocess.run(cmd, check=True, stdout=sys.stderr)
        return json.load(open(out.name))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build")
    p.add_argument("--layouts", nargs="+", default=LAYOUTS)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--extra", default="", help="flags for every run (e.g. --hidden 512,512,512)")
    p.add_argument("--torch-python", default="", help="python with torch >= 2.4, for torch:SCHEDULE layouts")
    p.add_argument("--json", default="")
    args = p.parse_args()
    results = {layout: [] for layout in args.layouts}
    for r in range(args.rounds):
        order = args.layouts if r % 2 == 0 else list(reversed(args.layouts))
        for layout in order:
            results[layout].append(run(args.build, layout, args.epochs, args.extra, args.torch_python))
    base = statistics.median(x["samples_per_second"] for x in results[args.layouts[0]])
    base_accuracy = results[args.layouts[0]][-1]["test_accuracy"]
    print(f"# fashion_mnist_parallel: {args.epochs} epochs, {args.rounds} rounds (alternating); "
          f"ratio and accuracy gap against layout {args.layouts[0]!r}")
    print(f"# {'layout':>28} {'dp':>3} {'pp':>3} {'tp':>3} {'schedule':>12} {'samples/s':>10} {'ratio':>6} "
          f"{'bubble':>7} {'accuracy':>9} {'gap':>7}")
    for layout in args.layouts:
        runs = results[layout]
        rate = statistics.median(x["samples_per_second"] for x in runs)
        last = runs[-1]
        print(f"  {layout:>28} {last['dp']:>3} {last['pp']:>3} {last['tp']:>3} {last['schedule']:>12} {rate:>10.0f} "
              f"{rate / base:>6.2f} {statistics.median(x['bubble'] for x in runs):>7.3f} {last['test_accuracy']:>9.4f} "
              f"{last['test_accuracy'] - base_accuracy:>+7.4f}")
    if args.json:
        json.dump(results, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()

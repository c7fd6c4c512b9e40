#!/usr/bin/env python3
"""PyTorch DDP on Fashion-MNIST over dtrain's torch.distributed backend against Gloo, same run.

Runs bench/peers/ddp_fashion_mnist.py (MLP 784-256-128-10, SGD momentum, global batch 128, seed 1,
one thread per process) with --backend gloo and --backend dtrain, alternated round by round, at
each rank count, and prints per configuration the samples/s range, the median over rounds of
dtrain's samples/s over Gloo's from the same round, each backend's final test accuracy, and the
share of a step spent in DDP's gradient sync (a step with it against the same step without).

  /usr/bin/python3 bench/ddp_backends.py --build build [--ranks 2 4] [--rounds 3] [--epochs 2]
  python3 bench/ddp_backends.py --device cuda --module-dir DIR --ranks 2   # CUDA tensors (staged by dtrain and by Gloo)
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def run(args, backend, ranks):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        module_dir = args.module_dir or os.path.join(os.path.abspath(args.build), "extensions", "torch_backend")
        cmd = [sys.executable, os.path.join(HERE, "peers", "ddp_fashion_mnist.py"), "--ranks", str(ranks), "--epochs",
               str(args.epochs), "--backend", backend, "--json", out.name, "--module-dir", module_dir,
               "--device", args.device] + (["--data", args.data] if args.data else [])
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=1800)
        with open(out.name) as f:
            return json.load(f)


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build")
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--json", default="", help="write every run's summary here")
    p.add_argument("--module-dir", default="", help="where dtrain_torch was built (default: under --build)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where the model and the data live")
    p.add_argument("--data", default="", help="the Fashion-MNIST folder (default: the peer script's)")
    args = p.parse_args()
    results = {}
    for r in range(args.rounds):
        for ranks in args.ranks:
            for backend in ("gloo", "dtrain") if r % 2 == 0 else ("dtrain", "gloo"):
                print(f"round {r + 1}/{args.rounds}: {backend}, {ranks} ranks", file=sys.stderr, flush=True)
                results.setdefault((ranks, backend), []).append(run(args, backend, ranks))
    commit = subprocess.run(["git", "-C", HERE, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    import torch
    print(f"# DDP Fashion-MNIST, {args.epochs} epochs, global batch 128, seed 1; {args.rounds} alternated rounds")
    gpu = f", GPU {torch.cuda.get_device_name()}" if args.device == "cuda" else ""
    print(f"# machine: {os.cpu_count()} CPUs, {cpu_name()}{gpu}; tensors on {args.device}; torch {torch.__version__}; "
          f"dtrain {commit}")
    print("| ranks | backend | samples/s (low-high) | dtrain / gloo (median) | final test accuracy "
          "| gradient sync share of a step |")
    print("|---|---|---|---|---|---|")
    for ranks in args.ranks:
        gloo, mine = results[(ranks, "gloo")], results[(ranks, "dtrain")]
        ratio = statistics.median(m["samples_per_second"] / g["samples_per_second"] for m, g in zip(mine, gloo))
        for backend, runs in (("gloo", gloo), ("dtrain", mine)):
            sps = [x["samples_per_second"] for x in runs]
            accs = sorted({round(x["test_accuracy"], 4) for x in runs})
            shares = [x["communication_share"] for x in runs]
            versus = f'{ratio:.2f}x' if backend == 'dtrain' else ''
            print(f"| {ranks} | {backend} | {min(sps):.0f}-{max(sps):.0f} | {versus} | "
                  f"{', '.join(f'{a:.4f}' for a in accs)} | {min(shares):.0%}-{max(shares):.0%} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({f"{k[0]}/{k[1]}": v for k, v in results.items()}, f, indent=1)


if __name__ == "__main__":
    main()

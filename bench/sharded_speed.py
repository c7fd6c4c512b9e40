#!/usr/bin/env python3
"""Samples/s of the sharded trainers against the allreduce trainer and PyTorch FSDP, same model and
recipe, same run: examples/sharded_mlp (784-1024x4-10, Adam, global batch 128, one epoch of
--limit-train samples, one thread per process) with --trainer zero3, zero2 and allreduce, and
bench/fsdp_mlp.py (FSDP2's fully_shard on CPU over gloo, FULL_SHARD and SHARD_GRAD_OP) when a
torch 2 Python is given, alternated round by round. Prints each one's samples/s (low-high over
the rounds) and peak RSS growth, and the median over rounds of the same-round ratios.

  python3 bench/sharded_speed.py --build build [--ranks 4] [--rounds 3] \\
      [--torch-python /opt/dtrain/torch2/bin/python]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

from ps_throughput import commit, machine
from sharded_memory import run_example


def fsdp_run(python, ranks, reshard, limit_train):
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fsdp_mlp.py")
    cmd = [python, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), script,
           "--reshard-after-forward", str(reshard), "--limit-train", str(limit_train)]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    rows = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not rows:
        sys.exit(f"{' '.join(cmd)} failed with status {done.returncode}:\n{done.stdout}")
    return json.loads(rows[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--limit-train", type=int, default=8192)
    ap.add_argument("--torch-python", default="", help="a Python with torch 2 (FSDP2): adds FSDP's rows")
    args = ap.parse_args()
    runs = [(trainer, lambda t=trainer: run_example(args.build, args.ranks, args.limit_train, "--trainer", t))
            for trainer in ("zero3", "zero2", "allreduce")]
    if args.torch_python:
        runs += [("fsdp full_shard", lambda: fsdp_run(args.torch_python, args.ranks, 1, args.limit_train)),
                 ("fsdp shard_grad_op", lambda: fsdp_run(args.torch_python, args.ranks, 0, args.limit_train))]
    rounds = []  # per round: name -> summary
    for r in range(args.rounds):
        got = {}
        for name, run in runs:
            print(f"round {r + 1}/{args.rounds}: {name}", file=sys.stderr, flush=True)
            got[name] = run()
        rounds.append(got)
    source = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    torch_version = rounds[0].get("fsdp full_shard", {}).get("torch", "")
    print(f"# sharded_mlp's model at P = {args.ranks}, one epoch of {args.limit_train} samples, "
          f"{args.rounds} alternated rounds" + (f"; torch {torch_version}" if torch_version else ""))
    print(f"# machine: {machine()}; dtrain {commit(source)}")
    print("| trainer | samples/s (low-high) | test accuracy | peak RSS growth (MiB) |")
    print("|---|---|---|---|")
    for name, _ in runs:
        rate = [g[name]["samples_per_second"] for g in rounds]
        acc = [g[name]["test_accuracy"] for g in rounds]
        rss = max(g[name]["rss_growth_bytes"] for g in rounds) / 2 ** 20
        print(f"| {name} | {min(rate):.0f}-{max(rate):.0f} | {statistics.median(acc):.4f} | {rss:.1f} |")
    pairs = [("zero2", "allreduce"), ("zero3", "allreduce")]
    if args.torch_python:
        pairs += [("zero3", "fsdp full_shard"), ("zero2", "fsdp shard_grad_op")]
    print("\n| ratio | median of same-round ratios (low-high) |")
    print("|---|---|")
    for a, b in pairs:
        ratios = [g[a]["samples_per_second"] / g[b]["samples_per_second"] for g in rounds]
        print(f"| {a} / {b} | {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}) |")


if __name__ == "__main__":
    main()

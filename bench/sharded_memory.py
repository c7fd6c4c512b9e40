#!/usr/bin/env python3
"""Per-rank memory of ZeRO stage 3 against ZeRO's formula and the process's own growth: the
sharded_mlp example (784-1024x4-10, 3.96 M parameters, Adam) for one short epoch at P = 2, 4, 8,
in fp32 and bf16. For each it prints

  - ZeRO's stage-3 figure, 16/P bytes per parameter (fp32 master weights, gradients' slice and
    Adam's two moments; Rajbhandari et al., SC'20, mixed-precision Adam);
  - the trainer's own accounting of that state (parameters + gradients + optimizer state) and its
    ratio to the formula (padding to a multiple of P per layer is the difference);
  - the trainer's peak, the state plus the gathered layers and their gradients in flight;
  - the growth of the rank's peak resident memory (VmHWM, reset before the trainer is built) over
    the first epoch's steps, the largest over the ranks, and its ratio to the trainer's peak
    (the rest is the model's activations and scratch, and the allocator's slack).

  python3 bench/sharded_memory.py --build build [--ranks 2,4,8] [--limit-train 2048]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

from ps_throughput import commit, machine

MIB = 1024.0 * 1024.0


def run_example(build, ranks, limit_train, *options):
    """One epoch of examples/sharded_mlp under dtrain-run with no budget; its JSON summary."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "summary.json")
        cmd = [os.path.join(build, "tools", "dtrain-run"), "-n", str(ranks),
               os.path.join(build, "examples", "sharded_mlp"),
               "--epochs", "1", "--limit-train", str(limit_train), "--log-every", "0", "--budget-mib", "100000",
               "--json", out, *options]
        done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if done.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed with status {done.returncode}:\n{done.stdout}")
        with open(out) as f:
            return json.load(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--ranks", default="2,4,8")
    ap.add_argument("--limit-train", type=int, default=2048)
    args = ap.parse_args()
    source = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    print(f"# ZeRO stage 3 per-rank memory, examples/sharded_mlp, one epoch of {args.limit_train} samples")
    print(f"# machine: {machine()}; dtrain {commit(source)}")
    print("| P | precision | ZeRO 16/P (MiB) | trainer's state (MiB) | state / formula | trainer's peak (MiB) "
          "| peak RSS growth (MiB) | RSS / trainer's peak |")
    print("|---|---|---|---|---|---|---|---|")
    for ranks in (int(r) for r in args.ranks.split(",")):
        for precision in ("fp32", "bf16"):
            s = run_example(args.build, ranks, args.limit_train, "--precision", precision)
            formula = 16.0 * s["parameters"] / ranks
            state = s["parameters_bytes"] + s["gradients_bytes"] + s["optimizer_state_bytes"]
            peak, rss = s["trainer_peak_bytes"], s["rss_growth_bytes"]
            print(f"| {ranks} | {precision} | {formula / MIB:.2f} | {state / MIB:.2f} | {state / formula:.3f} "
                  f"| {peak / MIB:.2f} | {rss / MIB:.2f} | {rss / peak:.3f} |", flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""dtrain vs Open MPI (and torch's Gloo), float32 sum allreduce on one host, same run, over shared
memory or TCP.

For each world size P, in alternating rounds (this machine is shared and noisy), measures
  --path shm: dtrain bench_collectives --transport shm (every allreduce algorithm)
              Open MPI MPI_Allreduce with --mca btl vader,self --mca pml ob1 (CMA single copy where allowed)
  --path tcp: dtrain bench_collectives --transport tcp (every allreduce algorithm)
              Open MPI MPI_Allreduce with --mca btl tcp,self --mca pml ob1 (loopback)
  --peers gloo: also torch.distributed's Gloo on CPU tensors (loopback TCP, its only path),
              bench/peers/torch_gloo_allreduce.py under --python (a Python with torch)
dtrain with blocking and spin progress (--progress: any of default, blocking, spin), and prints the
median over rounds of each side's best busbw (GB/s, nccl-tests' definition), dtrain's ratio to each
peer, and the time per call (us). Every result is checked by every program; any wrong element fails
the run.

  python3 bench/compare_openmpi.py --build build [--path shm|tcp] [--ranks 2 4 8] [--rounds 3]
                                   [--sizes 4096 65536 ...] [--peers openmpi gloo] [--python PY]
                                   [--json out.json]
"""
import os
import argparse
import json
import statistics
import subprocess
import sys
import tempfile

from compare_tcp import SIZES, best, finish, json_lines, run


def step_factor(sizes):
    """4 when every size is the smallest times a power of 4 (fewer points to run), else 2."""
    return 4 if all((s // min(sizes)).bit_length() % 2 == 1 for s in sizes) else 2


def dtrain_rows(build, path, p, seconds, progress, sizes):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        run([f"{build}/tools/dtrain-run", "-n", str(p), f"{build}/bench/bench_collectives", "--transport", path,
             "--progress", progress, "--ops", "allreduce", "-b", str(min(sizes)), "-e", str(max(sizes)),
             "-f", str(step_factor(sizes)), "-t", str(seconds), "--json", f.name])
        rows = json.load(open(f.name))
    for r in rows:
        r["peer"] = "dtrain"
        r["algorithm"] = f'{r["algorithm"]}/{progress}'
    return [r for r in rows if r["bytes"] in sizes]


def mpi_rows(build, path, p, seconds, sizes):
    btl = "vader,self" if path == "shm" else "tcp,self"
    return json_lines(run(["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "btl", btl,
                           "--mca", "pml", "ob1", "-np", str(p), f"{build}/bench/mpi_allreduce", "-t", str(seconds)]
                          + [str(s) for s in sizes]))


def gloo_rows(python, p, seconds, sizes):
    here = os.path.dirname(os.path.abspath(__file__))
    return json_lines(run([python, f"{here}/peers/torch_gloo_allreduce.py", "--ranks", str(p), "-t", str(seconds)]
                          + [str(s) for s in sizes]))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--path", choices=["shm", "tcp"], default="shm")
    ap.add_argument("--sizes", type=int, nargs="+", default=SIZES, help="message sizes in bytes (powers of two)")
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=0.3)
    ap.add_argument("--json", default="")
    ap.add_argument("--progress", nargs="+", default=["blocking", "spin"], choices=["default", "blocking", "spin"],
                    help="dtrain's progress policies, each run and the best kept (default: blocking and spin)")
    ap.add_argument("--peers", nargs="+", default=["openmpi"], choices=["openmpi", "gloo"],
                    help="the libraries dtrain is measured against (gloo: torch's, through --python)")
    ap.add_argument("--python", default=sys.executable, help="the Python whose torch runs the Gloo peer")
    a = ap.parse_args()
    rows = []
    for rnd in range(a.rounds):
        for p in a.ranks:
            # Alternate the order of the sides, so none always runs on a warmer or quieter machine.
            sides = [lambda: [r for prog in a.progress
                              for r in dtrain_rows(a.build, a.path, p, a.seconds, prog, a.sizes)]]
            if "openmpi" in a.peers:
                sides.append(lambda: mpi_rows(a.build, a.path, p, a.seconds, a.sizes))
            if "gloo" in a.peers:
                sides.append(lambda: gloo_rows(a.python, p, a.seconds, a.sizes))
            k = rnd % len(sides)  # each side first in turn
            for side in sides[k:] + sides[:k]:
                for r in side():
                    r["round"] = rnd
                    rows.append(r)

    def median_best(peer, p, size):
        per_round = [best([r for r in rows if r["round"] == k], peer, p, size) for k in range(a.rounds)]
        per_round = [r for r in per_round if r]
        return (statistics.median(r["busbw_GBps"] for r in per_round),
                statistics.median(r["time_us"] for r in per_round), per_round)

    names = {"openmpi": "OpenMPI", "gloo": "Gloo"}
    peers = [q for q in names if q in a.peers]
    over = 'shared memory' if a.path == 'shm' else 'TCP loopback'
    print(f"# float32 sum allreduce over {over}, busbw GB/s, median over {a.rounds} alternating rounds of each"
          " side's best; dtrain = best of its algorithms and progress policies")
    print(f"# {'P':>2} {'size':>10} | {'dtrain':>7}" + "".join(f" {names[q]:>8}" for q in peers) + " |"
          + "".join(f" {'vs ' + names[q]:>10}" for q in peers) + f" | {'dtrain us':>10}"
          + "".join(f" {names[q] + ' us':>10}" for q in peers) + " | dtrain's best (per round)")
    for p in a.ranks:
        for size in a.sizes:
            d_bw, d_us, d_rows = median_best("dtrain", p, size)
            theirs = [median_best(q, p, size) for q in peers]
            ratios = [d_bw / bw if bw > 0 else float("nan") for bw, _, _ in theirs]
            print(f"  {p:>2} {size:>10} | {d_bw:>7.3f}" + "".join(f" {bw:>8.3f}" for bw, _, _ in theirs) + " |"
                  + "".join(f" {r:>9.2f}x" for r in ratios) + f" | {d_us:>10.2f}"
                  + "".join(f" {us:>10.2f}" for _, us, _ in theirs) + f" | {', '.join(r['algorithm'] for r in d_rows)}")
    return finish(rows, a.json)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""What chain replication costs: bench_ps with 1 and with 2 copies of every shard, alternated
round by round, on 2 servers with 1 and 2 workers. Prints push and push+pull GB/s (low-high over
the rounds) and the median over rounds of k=2 / k=1, each pair measured in the same round.

  python3 bench/ps_replication.py --build build [--rounds 3] [--seconds 1] [--sizes 1048576 16777216]
"""
import argparse
import os
import sys

from ps_throughput import commit, machine, ratio_cells, run_json


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1 << 20, 16 << 20])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = ap.parse_args()
    run = os.path.join(args.build, "tools", "dtrain-run")
    ps = os.path.join(args.build, "bench", "bench_ps")
    ops = ["dense push", "dense push+pull"]
    samples = {}  # (workers, replicas, op, bytes) -> [GB/s per round]
    for rnd in range(args.rounds):
        for workers in args.workers:
            for replicas in (1, 2):
                print(f"round {rnd + 1}/{args.rounds}: 2 servers, {workers} worker(s), {replicas} replica(s)",
                      file=sys.stderr, flush=True)
                cmd = [run, "--servers", "2", "-n", str(2 + workers), ps, "--only", "dense",
                       "--replicas", str(replicas),
                       "--seconds", str(args.seconds), "--sizes", *map(str, args.sizes)]
                for row in run_json(cmd):
                    if row["op"] in ops:
                        samples.setdefault((workers, replicas, row["op"], row["bytes"]), []).append(row["GBps"])
    source = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    print(f"# chain replication cost, bench_ps over TCP, ASP, 2 servers, {args.rounds} alternated rounds, "
          f"{args.seconds:g} s per point")
    print(f"# machine: {machine()}; dtrain {commit(source)}")
    print("| workers | op | size | 1 replica, GB/s | 2 replicas, GB/s | 2 / 1 (median) |")
    print("|---|---|---|---|---|---|")
    for workers in args.workers:
        for op in ops:
            for size in args.sizes:
                one, two, median = ratio_cells(samples.get((workers, 1, op, size), []),
                                               samples.get((workers, 2, op, size), []))
                print(f"| {workers} | {op.split(' ', 1)[1]} | {size >> 20} MiB | {one} | {two} | {median} |")


if __name__ == "__main__":
    main()

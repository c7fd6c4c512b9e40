#!/usr/bin/env python3
"""What more shards than servers cost: bench_ps on 2 servers and 2 workers with the keys cut into
2 shards (one per server) and into more (DTRAIN_PS_SHARDS), alternated round by round. A sparse
push+pull is one request per shard its keys fall in, and a dense tensor's slices spread over the
shards. Prints sparse push+pull Mkeys/s and dense push+pull GB/s (low-high over the rounds) and
the median over rounds of more / one per server, each pair measured in the same round.

  python3 bench/ps_shards.py --build build [--rounds 3] [--seconds 1] [--shards 8]
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
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--slice-kib", type=int, default=256, help="dense slice size: a 1 MiB tensor is 4 slices")
    args = ap.parse_args()
    run = os.path.join(args.build, "tools", "dtrain-run")
    ps = os.path.join(args.build, "bench", "bench_ps")
    wanted = {"sparse push+pull": "Mkeys_per_s", "dense push+pull": "GBps"}
    samples = {}  # (shards, op) -> [figure per round]
    for rnd in range(args.rounds):
        for shards in (2, args.shards):
            print(f"round {rnd + 1}/{args.rounds}: 2 servers, 2 workers, {shards} shards", file=sys.stderr, flush=True)
            env = dict(os.environ, DTRAIN_PS_SHARDS=str(shards))
            cmd = [run, "--servers", "2", "-n", "4", ps, "--seconds", str(args.seconds), "--sizes", str(1 << 20),
                   "--slice-kib", str(args.slice_kib)]
            for row in run_json(cmd, env=env):
                if row["op"] in wanted:
                    samples.setdefault((shards, row["op"]), []).append(row[wanted[row["op"]]])
    source = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    print(f"# shards per server, bench_ps over TCP, ASP, 2 servers and 2 workers, {args.rounds} alternated rounds, "
          f"{args.seconds:g} s per point, {args.slice_kib} KiB dense slices")
    print(f"# machine: {machine()}; dtrain {commit(source)}")
    print(f"| op | unit | 2 shards | {args.shards} shards | {args.shards} / 2 (median) |")
    print("|---|---|---|---|---|")
    for op, unit in wanted.items():
        one, more, median = ratio_cells(samples.get((2, op), []), samples.get((args.shards, op), []))
        print(f"| {op} | {unit.replace('_per_s', '/s').replace('GBps', 'GB/s')} | {one} | {more} | {median} |")


if __name__ == "__main__":
    main()

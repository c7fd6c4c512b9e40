#!/usr/bin/env python3
"""dtrain vs Open MPI, float32 sum allreduce on one host, same run, over shared memory or TCP.

For each world size P, in alternating rounds (this machine is shared and noisy), measures
  --path shm: dtrain bench_collectives --transport shm (every allreduce algorithm)
              Open MPI MPI_Allreduce with --mca btl vader,self --mca pml ob1 (CMA single copy where allowed)
  --path tcp: dtrain bench_collectives --transport tcp (every allreduce algorithm)
              Open MPI MPI_Allreduce with --mca btl tcp,self --mca pml ob1 (loopback)
dtrain with blocking and spin progress (--progress: any of default, blocking, spin), and prints the median over rounds of each side's best busbw
(GB/s, nccl-tests' definition), the ratio, and the time per call (us). Every result is checked by
both programs; any wrong element fails the run.

  python3 bench/compare_openmpi.py --build build [--path shm|tcp] [--ranks 2 4 8] [--rounds 3]
                                   [--sizes 4096 65536 ...] [--json out.json]
"""
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
             "--progress", progress, "--ops", "allreduce", "-b", str(min(sizes)), "-e", str(max(sizes)), "-f", str(step_factor(sizes)),
             "-t", str(seconds), "--json", f.name])
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
    a = ap.parse_args()
    rows = []
    for rnd in range(a.rounds):
        for p in a.ranks:
            # Alternate which side goes first, so neither always runs on a warmer or quieter machine.
            sides = [lambda: mpi_rows(a.build, a.path, p, a.seconds, a.sizes),
                     lambda: [r for prog in a.progress for r in dtrain_rows(a.build, a.path, p, a.seconds, prog, a.sizes)]]
            for side in (sides if rnd % 2 == 0 else sides[::-1]):
                for r in side():
                    r["round"] = rnd
                    rows.append(r)

    def median_best(peer, p, size):
        per_round = [best([r for r in rows if r["round"] == k], peer, p, size) for k in range(a.rounds)]
        per_round = [r for r in per_round if r]
        return (statistics.median(r["busbw_GBps"] for r in per_round),
                statistics.median(r["time_us"] for r in per_round), per_round)

    print(f"# float32 sum allreduce over {'shared memory' if a.path == 'shm' else 'TCP loopback'}, busbw GB/s, median over {a.rounds} alternating rounds of each"
          " side's best; dtrain = best of its algorithms and progress policies")
    print(f"# {'P':>2} {'size':>10} | {'dtrain':>7} {'OpenMPI':>8} | {'ratio':>6} | {'dtrain us':>10} {'OpenMPI us':>10}"
          f" | dtrain's best (per round)")
    for p in a.ranks:
        for size in a.sizes:
            d_bw, d_us, d_rows = median_best("dtrain", p, size)
            m_bw, m_us, _ = median_best("openmpi", p, size)
            ratio = d_bw / m_bw if m_bw > 0 else float("nan")
            print(f"  {p:>2} {size:>10} | {d_bw:>7.3f} {m_bw:>8.3f} | {ratio:>5.2f}x | {d_us:>10.2f} {m_us:>10.2f} |"
                  f" {', '.join(r['algorithm'] for r in d_rows)}")
    return finish(rows, a.json)


if __name__ == "__main__":
    sys.exit(main())

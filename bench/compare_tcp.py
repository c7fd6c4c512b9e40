#!/usr/bin/env python3
"""dtrain vs Open MPI vs Gloo: float32 sum allreduce over TCP on this machine, in one run.

For each world size P and size, measures
  dtrain   bench_collectives --transport tcp (ring, halving_doubling, recursive_doubling; blocking and spin)
  Open MPI MPI_Allreduce with --mca btl tcp,self --mca pml ob1
  Gloo     AllreduceRingChunked and AllreduceHalvingDoubling over Gloo's TCP transport
and prints busbw (GB/s, nccl-tests' definition) with dtrain's best divided by each peer's.

  python3 bench/compare_tcp.py --build build [--ranks 2 4] [--json out.json]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

SIZES = [4096, 65536, 1 << 20, 16 << 20, 64 << 20]


def run(cmd, env=None):
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=1800)
    if out.returncode != 0:
        sys.exit(f"failed ({out.returncode}): {' '.join(cmd)}\n{out.stdout}")
    return out.stdout


def json_lines(text):
    rows = []
    for line in text.splitlines():
        m = re.search(r"(\{.*\})", line)
        if m:
            rows.append(json.loads(m.group(1)))
    return rows


def dtrain_rows(build, p, seconds, progress):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        run([f"{build}/tools/dtrain-run", "-n", str(p), f"{build}/bench/bench_collectives", "--transport", "tcp",
             "--progress", progress, "--ops", "allreduce",
             "--algorithms", "ring", "halving_doubling", "recursive_doubling",
             "-b", str(SIZES[0]), "-e", str(SIZES[-1]), "-f", "4", "-t", str(seconds), "--json", f.name])
        rows = json.load(open(f.name))
    for r in rows:
        r["peer"] = "dtrain"
        r["algorithm"] = f'{r["algorithm"]}/{progress}'
    return [r for r in rows if r["bytes"] in SIZES]


def mpi_rows(build, p, seconds):
    return json_lines(run(["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "btl", "tcp,self",
                           "--mca", "pml", "ob1", "-np", str(p), f"{build}/bench/mpi_allreduce", "-t", str(seconds)]
                          + [str(s) for s in SIZES]))


def gloo_rows(build, p):
    with tempfile.TemporaryDirectory() as store:
        return json_lines(run([f"{build}/tools/dtrain-run", "-n", str(p), f"{build}/bench/gloo_allreduce", store]
                              + [str(s) for s in SIZES]))


def best(rows, peer, p, size):
    cands = [r for r in rows if r["peer"] == peer and r["ranks"] == p and r["bytes"] == size]
    return max(cands, key=lambda r: r["busbw_GBps"]) if cands else None


def finish(rows, json_path):
    """Prints the count of measurements and wrong elements, writes the rows as JSON if asked;
    @returns the exit status: 1 if any result was wrong."""
    wrong = sum(r.get("wrong", 0) for r in rows)
    print(f"# {len(rows)} measurements, {wrong} wrong result elements")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if wrong == 0 else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--seconds", type=float, default=0.5)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    rows = []
    for p in a.ranks:
        for progress in ("blocking", "spin"):
            rows += dtrain_rows(a.build, p, a.seconds, progress)
        rows += mpi_rows(a.build, p, a.seconds)
        rows += gloo_rows(a.build, p)
    print("# float32 sum allreduce over TCP (loopback), busbw in GB/s; dtrain = best of its algorithms and policies")
    print(f"# {'P':>2} {'size':>10} | {'dtrain':>7} {'(algorithm/progress)':<28}"
          f" {'OpenMPI':>8} {'Gloo':>7} {'(best)':<26}"
          f" | {'vs MPI':>7} {'vs Gloo':>8}")
    for p in a.ranks:
        for size in SIZES:
            d, m, g = best(rows, "dtrain", p, size), best(rows, "openmpi", p, size), best(rows, "gloo", p, size)
            ratio = lambda x: f"{d['busbw_GBps'] / x['busbw_GBps']:.2f}x" if d and x and x["busbw_GBps"] > 0 else "-"
            print(f"  {p:>2} {size:>10} | {d['busbw_GBps']:>7.3f} {d['algorithm']:<28} {m['busbw_GBps']:>8.3f}"
                  f" {g['busbw_GBps']:>7.3f} {g['algorithm']:<26} | {ratio(m):>7} {ratio(g):>8}")
    return finish(rows, a.json)


if __name__ == "__main__":
    sys.exit(main())

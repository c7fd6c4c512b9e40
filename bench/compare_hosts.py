#!/usr/bin/env python3
"""dtrain's flat and hierarchical allreduce against Open MPI on an emulated cluster, in one run.

Each round starts bench/emulated_cluster.sh twice, alternating, on the same namespaces layout:
  dtrain   bench_collectives --transport tcp-hosts: every flat algorithm, 'hierarchical' (two
           levels, forced) and 'auto' (calibrate()'s constants decide), float32 sum
  Open MPI mpi_allreduce under mpirun on the same emulated hosts (btl tcp,self, pml ob1)
and prints, per size, the median over rounds of busbw (GB/s, nccl-tests' definition): the best
flat algorithm, hierarchical, auto (and what it chose), Open MPI, and the ratios the bars of
issue 18 ask for: hierarchical / best flat, whether auto was the fastest (within 5%), dtrain's
best / Open MPI. Needs root (network namespaces) and a build with the benchmarks.

  python3 bench/compare_hosts.py --build build [--hosts 2] [--ranks-per-host 2] [--rate 1gbit]
                                 [--strict] [--rounds 3] [--json out.json]

--strict shapes the links with a 16 KiB token bucket and 8 KiB segments (emulated_cluster.sh's
--burst 16384 --gso 8192), so that no message crosses faster than the rate after an idle spell.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES = [4096 * 4 ** i for i in range(8)]  # 4 KiB .. 64 MiB


def cluster(args, extra, program):
    strict = ["--burst", "16384", "--gso", "8192"] if args.strict else []
    cmd = [os.path.join(HERE, "emulated_cluster.sh"), "--hosts", str(args.hosts), "--ranks-per-host",
           str(args.ranks_per_host), "--rate", args.rate] + strict + extra + ["--"] + program
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800)
    if out.returncode == 77:
        sys.exit(f"skipped: {out.stdout.strip()}")
    if out.returncode != 0:
        sys.exit(f"failed ({out.returncode}): {' '.join(cmd)}\n{out.stdout}")
    return out.stdout


def dtrain_round(args):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        text = cluster(args, [], [f"{args.build}/bench/bench_collectives", "--transport", "tcp-hosts", "--ops",
                                  "allreduce", "-b", str(SIZES[0]), "-e", str(SIZES[-1]), "-f", "4", "-t",
                                  str(args.seconds), "--json", f.name])
        rows = json.load(open(f.name))
    calibrated = re.search(r"# calibrated: (.*)", text)
    return rows, calibrated.group(1) if calibrated else ""


def mpi_round(args):
    text = cluster(args, ["--mpirun"], [f"{args.build}/bench/mpi_allreduce", "-t", str(args.seconds)] +
                   [str(s) for s in SIZES])
    return [json.loads(m.group(1)) for m in re.finditer(r"(\{\"peer\": \"openmpi\".*\})", text)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--ranks-per-host", type=int, default=2)
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--strict", action="store_true", help="a 16 KiB token bucket instead of 2 ms")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=0.3)
    ap.add_argument("--json", default="")
    args = ap.parse_args()

    busbw = {}  # (size, name) -> [busbw per round]
    chosen = {}  # size -> [auto's choice per round]
    calibrations = []
    for r in range(args.rounds):
        rows, calibrated = dtrain_round(args)
        calibrations.append(calibrated)
        for row in rows:
            name = row["algorithm"]
            if name.startswith("auto:"):
                chosen.setdefault(row["bytes"], []).append(name[5:])
                name = "auto"
            busbw.setdefault((row["bytes"], name), []).append(row["busbw_GBps"])
        for row in mpi_round(args):
            busbw.setdefault((row["bytes"], "openmpi"), []).append(row["busbw_GBps"])
        print(f"# round {r + 1}/{args.rounds} done; calibrated {calibrated}", file=sys.stderr)

    med = {k: statistics.median(v) for k, v in busbw.items()}
    flat = sorted({name for (_, name) in med if name not in ("hierarchical", "auto", "openmpi")})
    print(f"# emulated cluster: {args.hosts} hosts x {args.ranks_per_host} ranks, host links {args.rate}"
          f"{' (strict: 16 KiB bucket)' if args.strict else ''}; "
          f"median busbw (GB/s) of {args.rounds} alternating rounds")
    print(f"# {'size':>9} | {'best flat':>24} {'hierarchical':>12} {'auto (choice)':>28} {'Open MPI':>9} |"
          f" {'hier/flat':>9} {'auto best':>9} {'dtrain/MPI':>10}")
    results = []
    for size in SIZES:
        best_flat = max(flat, key=lambda n: med.get((size, n), 0))
        f, h, a, m = (med.get((size, best_flat), 0), med.get((size, "hierarchical"), 0), med.get((size, "auto"), 0),
                      med.get((size, "openmpi"), 0))
        choice = max(set(chosen.get(size, ["?"])), key=chosen.get(size, ["?"]).count)
        fastest = max(f, h)
        auto_ok = a >= 0.95 * fastest
        ratio_mpi = max(f, h, a) / m if m else float("nan")
        print(f"  {size:>9} | {f:>9.4f} ({best_flat:>12}) {h:>12.4f} {a:>9.4f} ({choice:>16}) {m:>9.4f} |"
              f" {h / f if f else float('nan'):>8.2f}x {'yes' if auto_ok else 'NO':>9} {ratio_mpi:>9.2f}x")
        results.append({"bytes": size, "best_flat": best_flat, "best_flat_busbw": f, "hierarchical_busbw": h,
                        "auto_busbw": a, "auto_choice": choice, "openmpi_busbw": m, "auto_is_fastest": auto_ok})
    print("# calibrations: " + " | ".join(calibrations))
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"hosts": args.hosts, "ranks_per_host": args.ranks_per_host, "rate": args.rate,
                       "rounds": args.rounds, "rows": results, "runs": {f"{k[0]}/{k[1]}": v for k, v in busbw.items()}},
                      out, indent=1)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The scale simulator's predictions against measured time, on the emulated cluster.

For every shape the emulated cluster can hold here (P = 2, 4, 8 on 2 hosts; P = 4, 8 on 4
hosts) and each link rate, each round runs bench/emulated_cluster.sh with bench_collectives
--transport tcp-hosts (every flat allreduce algorithm, and the hierarchical one where hosts hold
more than one rank), which calibrates alpha and beta inside a host and between hosts at start-up
and prints them; then bench/simulate_scale --predict with those constants predicts every point.
Prints, per shape, rate and size, the median measured and predicted time per algorithm and their
ratio, and how many points are within 25%. Needs root (network namespaces) and a build with the
benchmarks.

  python3 bench/validate_scale.py --build build [--rates 1gbit,250mbit] [--rounds 3] [--json out.json]
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
SHAPES = [(2, 1), (2, 2), (2, 4), (4, 1), (4, 2)]  # (hosts, ranks per host)


def measure(args, hosts, per_host, rate):
    """One run: the measured rows and the simulator's flags from the calibration."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        cmd = [os.path.join(HERE, "emulated_cluster.sh"), "--hosts", str(hosts), "--ranks-per-host", str(per_host),
               "--rate", rate, "--burst", str(args.burst), "--gso", str(args.gso), "--",
               f"{args.build}/bench/bench_collectives", "--transport", "tcp-hosts", "--ops",
               "allreduce", "-b", str(args.min_bytes), "-e", str(args.max_bytes), "-f", str(args.factor), "-t",
               str(args.seconds), "--json", f.name]
        out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800)
        if out.returncode == 77:
            sys.exit(f"skipped: {out.stdout.strip()}")
        if out.returncode != 0:
            sys.exit(f"failed ({out.returncode}): {' '.join(cmd)}\n{out.stdout}")
        rows = json.load(open(f.name))
    flags = re.search(r"# simulate_scale: (.*)", out.stdout)
    if not flags:
        sys.exit("bench_collectives printed no calibration:\n" + out.stdout)
    return rows, flags.group(1).split()


def predict(args, hosts, per_host, flags):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([f"{args.build}/bench/simulate_scale", "--predict", "--hosts", str(hosts), "--per-host",
                        str(per_host), "-b", str(args.min_bytes), "-e", str(args.max_bytes), "-f", str(args.factor),
                        "--json", f.name] + flags, check=True, stdout=subprocess.DEVNULL)
        return json.load(open(f.name))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--rates", default="1gbit,250mbit")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=0.2)
    ap.add_argument("--min-bytes", type=int, default=4096)
    ap.add_argument("--max-bytes", type=int, default=16 << 20)
    ap.add_argument("--factor", type=int, default=16)
    # A strict link: a token bucket of 16 KiB and segments cut to 8 KiB, so that a short message
    # after an idle spell does not cross at the bridge's speed (the default 2 ms bucket lets up
    # to 250 KB through at once at 1 Gbit/s), as on a real link.
    ap.add_argument("--burst", type=int, default=16384, help="tc token bucket, bytes")
    ap.add_argument("--gso", type=int, default=8192, help="largest segment the veths hand to tc, bytes")
    ap.add_argument("--shapes", default=",".join(f"{h}x{l}" for h, l in SHAPES), help="hosts x ranks per host")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]

    measured, predicted, calibrations = {}, {}, {}  # (rate, hosts, per_host, algorithm, bytes) -> [us]
    for r in range(args.rounds):
        for rate in args.rates.split(","):
            for hosts, per_host in shapes:
                rows, flags = measure(args, hosts, per_host, rate)
                calibrations.setdefault(f"{rate} {hosts}x{per_host}", []).append(" ".join(flags))
                for row in rows:
                    if not row["algorithm"].startswith("auto"):
                        key = (rate, hosts, per_host, row["algorithm"], row["bytes"])
                        measured.setdefault(key, []).append(row["time_us"])
                for row in predict(args, hosts, per_host, flags):
                    key = (rate, hosts, per_host, row["algorithm"], row["bytes"])
                    predicted.setdefault(key, []).append(row["time_us"])
                print(f"# round {r + 1}/{args.rounds}: {rate} {hosts}x{per_host} calibrated {' '.join(flags)}",
                      file=sys.stderr)

    print(f"# scale simulator against the emulated cluster: median of {args.rounds} rounds "
          "(each its own calibration); time per allreduce in us")
    print(f"# {'rate':>6} {'hosts':>5} {'L':>2} {'P':>2} {'size':>9} {'algorithm':>19} | {'measured':>10} "
          f"{'predicted':>10} {'pred/meas':>9}")
    results, within = [], 0
    for key in sorted(measured, key=lambda k: (k[0], k[1], k[2], k[3], k[4])):
        if key not in predicted:
            continue
        rate, hosts, per_host, algo, size = key
        m, p = statistics.median(measured[key]), statistics.median(predicted[key])
        ok = abs(p / m - 1) <= 0.25
        within += ok
        print(f"  {rate:>6} {hosts:>5} {per_host:>2} {hosts * per_host:>2} {size:>9} {algo:>19} | {m:>10.1f} "
              f"{p:>10.1f} {p / m:>8.2f}{'' if ok else ' *'}")
        results.append({"rate": rate, "hosts": hosts, "per_host": per_host, "algorithm": algo, "bytes": size,
                        "measured_us": m, "predicted_us": p, "within_25pct": ok})
    print(f"# {within} of {len(results)} points within 25% (* marks the others)")
    by_algo = {}
    for r in results:
        by_algo.setdefault(r["algorithm"], []).append(r["within_25pct"])
    print("# within 25% per algorithm: " + ", ".join(f"{a} {sum(v)}/{len(v)}" for a, v in sorted(by_algo.items())))
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"rounds": args.rounds, "rows": results, "calibrations": calibrations}, out, indent=1)


if __name__ == "__main__":
    main()

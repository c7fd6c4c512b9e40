#!/usr/bin/env python3
"""What the flight recorder costs: bench_collectives with it on and off, same run, alternating.

For each transport (inproc: ranks as threads; shm and tcp: one process per rank under dtrain-run),
runs float32 sum allreduces of every size from --min-bytes to --max-bytes with the recorder on
(DTRAIN_FLIGHT_RECORDER_SIZE=2048, the default) and off (=0), in --rounds rounds whose order
alternates (on first, then off first), and prints per algorithm and size the median time per call
of each, their ratio, and the noise: the largest ratio between two rounds of the same setting.
A ratio inside the noise is no cost this machine can see. Every result is checked by
bench_collectives; any wrong element fails the run.

  python3 bench/flight_recorder_cost.py --build build [--transports inproc shm tcp] [--ranks 2]
                                        [--rounds 4] [--seconds 0.3] [--json out.json]
"""
import argparse
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_tcp import finish, run  # noqa: E402

ALGORITHMS = ["ring", "recursive_doubling"]


def measure(build, transport, ranks, recorder_size, a):
    env = dict(os.environ, DTRAIN_FLIGHT_RECORDER_SIZE=str(recorder_size))
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        bench = [f"{build}/bench/bench_collectives", "--transport", transport, "--ops", "allreduce",
                 "--algorithms", *ALGORITHMS, "-b", str(a.min_bytes), "-e", str(a.max_bytes), "-f", "4",
                 "-t", str(a.seconds), "--json", f.name]
        if transport == "inproc":
            run(bench + ["-n", str(ranks)], env=env)
        else:
            run([f"{build}/tools/dtrain-run", "-n", str(ranks)] + bench, env=env)
        rows = json.load(open(f.name))
    for r in rows:
        r["transport"], r["recorder"] = transport, recorder_size
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--transports", nargs="+", default=["inproc", "shm", "tcp"])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=0.3)
    ap.add_argument("--min-bytes", type=int, default=8)
    ap.add_argument("--max-bytes", type=int, default=1 << 20)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    rows = []
    for t in a.transports:
        for k in range(a.rounds):
            for size in ((2048, 0) if k % 2 == 0 else (0, 2048)):
                rows += [dict(r, round=k) for r in measure(a.build, t, a.ranks, size, a)]
    print(f"# flight recorder on (2048 calls) vs off, {a.ranks} ranks, median of {a.rounds} rounds, time per call")
    print(f"# {'transport':>9} {'algorithm':>18} {'bytes':>9} {'on_us':>9} {'off_us':>9} {'on/off':>7} {'noise':>6}")
    for t in a.transports:
        keys = sorted({(r["algorithm"], r["bytes"]) for r in rows if r["transport"] == t}, key=lambda k: (k[0], k[1]))
        for algo, size in keys:
            times = {s: [r["time_us"] for r in rows if r["transport"] == t and r["algorithm"] == algo
                         and r["bytes"] == size and r["recorder"] == s] for s in (2048, 0)}
            on, off = statistics.median(times[2048]), statistics.median(times[0])
            noise = max(max(v) / min(v) for v in times.values())
            print(f"  {t:>9} {algo:>18} {size:>9} {on:>9.2f} {off:>9.2f} {on / off:>7.3f} {noise:>6.2f}")
    return finish(rows, a.json)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The parameter server's throughput table in docs/performance.md, measured in one run.

Runs, alternated round by round so that a slow spell of the machine hits every program alike:
  dtrain   bench_ps under dtrain-run: dense push+pull (1 and 4 tensors in flight, 1+1 and 2+2
           servers+workers, or --layouts) and sparse push+pull of 100k keys (with and without key
           caching)
  bare TCP bench_tcp_ceiling: the same message patterns over blocking sockets (1 and 4 in flight)
  ZeroMQ   peers/zmq_push_pull: DEALER/ROUTER, ps-lite's transport (when built; libzmq)
  ps-lite  peers/pslite_push_pull (with --pslite DIR: a ps-lite checkout you built, and dtrain
           configured with -DDTRAIN_PSLITE_DIR=DIR), launched by ps-lite's own tests/local.sh
and prints, per configuration, the low-high range over the rounds of push+pull GB/s (dense) and
M keys/s (sparse), and the median over rounds of dtrain's figure over each peer's, each pair
measured in the same round, with the machine and the commit measured.

  python3 bench/ps_throughput.py --build build [--rounds 5] [--seconds 1] [--json ps_throughput.json]
  python3 bench/ps_throughput.py --build build --pslite /tmp/ps-lite        # with ps-lite's columns
  python3 bench/ps_throughput.py --build build --layouts 1+1 2+2 4+4        # servers+workers measured
  python3 bench/ps_throughput.py --from-json ps_throughput.json     # the table of a saved run
"""
import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile

DENSE_SIZES = [1 << 20, 16 << 20]
SPARSE_KEYS = 100000


def machine():
    model = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} vCPUs, {model}, {platform.system()} {platform.release()}"


def commit(source):
    out = subprocess.run(["git", "-C", source, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def ratio_cells(base, other):
    """Table cells for two series measured round by round: each as low-high, and the median over
    rounds of other / base (each pair from the same round)."""
    ratios = sorted(b / a for a, b in zip(base, other) if a > 0)
    median = f"{ratios[len(ratios) // 2]:.2f}x" if ratios else "-"
    cell = lambda v: f"{min(v):.2f}-{max(v):.2f}" if v else "-"
    return cell(base), cell(other), median


def run_json(cmd, env=None):
    """Runs `cmd` with `--json FILE` appended; returns the rows it wrote."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        out = subprocess.run(cmd + ["--json", f.name], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=env, timeout=900)
        if out.returncode != 0:
            sys.exit(f"failed ({out.returncode}): {' '.join(cmd)}\n{out.stdout}")
        return json.load(open(f.name))


def run_pslite(launcher, servers, workers, cmd):
    """Runs `cmd` under ps-lite's tests/local.sh (scheduler, servers and workers as background
    processes) with `--json FILE` appended, in a session of its own so that a hang is killed
    whole; returns the rows worker 0 wrote."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        proc = subprocess.Popen(["bash", launcher, str(servers), str(workers)] + cmd + ["--json", f.name],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            sys.exit(f"ps-lite timed out: {' '.join(cmd)}")
        rows = json.load(open(f.name)) if os.path.getsize(f.name) > 0 else None
        if proc.returncode != 0 or rows is None:
            sys.exit(f"ps-lite failed ({proc.returncode}): {' '.join(cmd)}\n{out[-3000:]}")
        return rows


def configurations(build, seconds, with_zmq, pslite, layouts):
    """(key, label, command, unit, rows -> {size: value}) for every program in the table; `layouts`
    lists the (servers, workers) pairs of the parameter servers."""
    run = [os.path.join(build, "tools", "dtrain-run")]
    ps = os.path.join(build, "bench", "bench_ps")
    sizes = [str(s) for s in DENSE_SIZES]
    common = ["--seconds", str(seconds)]

    def dense(rows):
        return {r["bytes"]: r["GBps"] for r in rows if r["op"].endswith("push+pull") and r["bytes"] in DENSE_SIZES}

    def sparse(rows):
        return {"keys": r["Mkeys_per_s"] for r in rows if r["op"] == "sparse push+pull"}

    def launch(s, w):
        return run + ["--servers", str(s), "-n", str(s + w), ps]

    configs = []
    for s, w in layouts:
        for depth in (1, 4):
            configs.append((f"dtrain_{s}_{w}" + ("_d4" if depth == 4 else ""),
                            f"dtrain bench_ps, {s}+{w}, {depth} in flight",
                            launch(s, w) + ["--only", "dense", "--sizes", *sizes]
                            + (["--depth", "4"] if depth == 4 else []) + common, "GB/s", dense))
    configs += [
        ("tcp_d1", "bare TCP (bench_tcp_ceiling), 1 in flight",
         [os.path.join(build, "bench", "bench_tcp_ceiling"), "--sizes", *sizes] + common, "GB/s", dense),
        ("tcp_d4", "bare TCP (bench_tcp_ceiling), 4 in flight",
         [os.path.join(build, "bench", "bench_tcp_ceiling"), "--sizes", *sizes, "--depth", "4"] + common, "GB/s",
         dense),
    ]
    zmq = os.path.join(build, "bench", "zmq_push_pull")
    if with_zmq:
        configs += [
            ("zmq_d1", "ZeroMQ (zmq_push_pull, server only answers), 1 in flight",
             [zmq, "--sizes", *sizes] + common, "GB/s", dense),
            ("zmq_d4", "ZeroMQ (zmq_push_pull, server only answers), 4 in flight",
             [zmq, "--sizes", *sizes, "--depth", "4"] + common, "GB/s", dense),
        ]
    if pslite:
        driver = os.path.join(build, "bench", "pslite_push_pull")
        launcher = os.path.join(pslite, "tests", "local.sh")
        for s, w in layouts:
            for depth in (1, 4):
                key = f"pslite_{s}_{w}" + ("_d4" if depth == 4 else "")
                configs.append((key, f"ps-lite (pslite_push_pull), {s}+{w}, {depth} in flight",
                                (launcher, s, w, [driver, "--only", "dense", "--sizes", *sizes, "--depth", str(depth)]
                                 + common), "GB/s", dense))
    keys = ["--only", "sparse", "--keys", str(SPARSE_KEYS)] + common
    for cache in (True, False):
        for s, w in layouts:
            configs.append((f"sparse_{s}_{w}" + ("" if cache else "_nc"),
                            f"dtrain sparse, {'key caching' if cache else '--no-key-cache'}, {s}+{w}",
                            launch(s, w) + ([] if cache else ["--no-key-cache"]) + keys, "Mkeys/s", sparse))
    if pslite:
        for s, w in layouts:
            configs.append((f"pslite_sparse_{s}_{w}", f"ps-lite sparse (KVServerDefaultHandle), {s}+{w}",
                            (launcher, s, w, [driver] + keys), "Mkeys/s", sparse))
    return configs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=1.0, help="time per measured point")
    ap.add_argument("--json", help="write every sample, with the machine and commit, to this file")
    ap.add_argument("--from-json", help="print the table of an earlier run's --json instead of measuring")
    ap.add_argument("--pslite", help="a built ps-lite checkout: adds its columns (its tests/local.sh launches it)")
    ap.add_argument("--layouts", nargs="+", default=["1+1", "2+2"], metavar="S+W",
                    help="parameter-server layouts measured: servers+workers (default: 1+1 2+2)")
    args = ap.parse_args()
    try:
        layouts = [tuple(int(n) for n in text.split("+")) for text in args.layouts]
    except ValueError:
        layouts = []
    if not layouts or any(len(sw) != 2 or min(sw) < 1 for sw in layouts):
        ap.error(f"--layouts takes servers+workers pairs such as 2+2, not {' '.join(args.layouts)}")
    source = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    saved = json.load(open(args.from_json)) if args.from_json else None
    # ZeroMQ is measured where its peer program was built; a saved run lists it if it had it.
    with_zmq = "zmq_d1" in saved["samples"] if saved else os.access(
        os.path.join(args.build, "bench", "zmq_push_pull"), os.X_OK)
    with_pslite = any(k.startswith("pslite_") for k in saved["samples"]) if saved else bool(args.pslite)
    if saved:
        layouts = [tuple(sw) for sw in saved.get("layouts", [(1, 1), (2, 2)])]
    configs = configurations(args.build, args.seconds, with_zmq, args.pslite or ("(saved)" if with_pslite else None),
                             layouts)
    samples = {key: {} for key, *_ in configs}
    where, measured = machine(), commit(source)
    if saved:
        where, measured, args.rounds = saved["machine"], saved["commit"], saved["rounds"]
        for key, cols in saved["samples"].items():
            samples[key] = {(int(c) if c.isdigit() else c): v for c, v in cols.items()}
    else:
        for rnd in range(args.rounds):
            for key, label, cmd, _, pick in configs:
                print(f"round {rnd + 1}/{args.rounds}: {label}", file=sys.stderr, flush=True)
                rows = run_pslite(*cmd) if isinstance(cmd, tuple) else run_json(cmd)
                for column, value in pick(rows).items():
                    samples[key].setdefault(column, []).append(value)

    def cell(values):
        return f"{min(values):.2f}-{max(values):.2f}" if values else "-"

    def ratio(key, peer, column):
        """The median over rounds of key / peer, each pair measured in the same round: the
        machine's drift between rounds cancels."""
        mine, theirs = samples[key].get(column, []), samples.get(peer, {}).get(column, [])
        ratios = sorted(a / b for a, b in zip(mine, theirs) if b > 0)
        return f"{ratios[len(ratios) // 2]:.2f}x" if ratios else "-"

    print(f"# parameter-server throughput, {args.rounds} alternated rounds, {args.seconds:g} s per point; "
          f"low-high over the rounds")
    print(f"# machine: {where}; dtrain {measured}")
    print("| push+pull, GB/s (both directions) | 1 MiB | 16 MiB | 1 MiB vs bare TCP, ZeroMQ, ps-lite | "
          "16 MiB vs bare TCP, ZeroMQ, ps-lite |")
    print("|---|---|---|---|---|")
    for key, label, _, unit, _ in configs:
        if unit != "GB/s":
            continue
        small, large = (cell(samples[key].get(size, [])) for size in DENSE_SIZES[:2])
        row = f"| {label} | {small} | {large} |"
        if key.startswith("dtrain"):
            # Against the peer with as many requests in flight.
            depth = "d4" if key.endswith("_d4") else "d1"
            for size in DENSE_SIZES:
                row += (f" {ratio(key, 'tcp_' + depth, size)}, {ratio(key, 'zmq_' + depth, size)}, "
                        f"{ratio(key, key.replace('dtrain', 'pslite'), size)} |")
        else:
            row += " | |"
        print(row)
    print("# ratios: the median over rounds of dtrain / peer, both measured in the same round, "
          "with as many requests in flight (bare TCP and ZeroMQ: one client and one server; ps-lite: as many "
          "servers and workers)")
    print()
    print(f"| sparse push+pull, {SPARSE_KEYS // 1000}k keys, M keys/s | low-high | vs ps-lite |")
    print("|---|---|---|")
    for key, label, _, unit, _ in configs:
        if unit == "Mkeys/s":
            peer = "pslite_sparse_" + key.split("_", 1)[1].removesuffix("_nc") if key.startswith("sparse") else ""
            print(f"| {label} | {cell(samples[key].get('keys', []))} | {ratio(key, peer, 'keys') if peer else ''} |")
    if args.json and not args.from_json:
        with open(args.json, "w") as f:
            json.dump({"machine": where, "commit": measured, "rounds": args.rounds, "layouts": layouts,
                       "samples": {k: {str(c): v for c, v in cols.items()} for k, cols in samples.items()}},
                      f, indent=1)


if __name__ == "__main__":
    main()

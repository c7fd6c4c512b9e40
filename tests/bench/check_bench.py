#!/usr/bin/env python3
"""Runs one benchmark of bench/ at small sizes and checks what it prints against what it measured.

    check_bench.py --bench-dir BUILD/bench --launcher BUILD/tools/dtrain-run CASE

Each benchmark must exit 0 (it exits 1 itself when a result is wrong: a collective's elements, a
parameter server's pulled values, a message that came back changed, a reduction kernel's output),
report no wrong result, and print the columns and JSON that docs/performance.md describes. The
derived figures are recomputed here from the measured times with nccl-tests' formulas (algbw =
bytes / time, busbw = algbw * the collective's factor), the table and the JSON must agree row by
row, and every requested size, collective and algorithm must appear. Timings are never judged:
this machine is shared and a smoke test is no benchmark.
"""

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile

# Every algorithm each collective has (bench_collectives runs them all): one added to the library
# and missing from the benchmark, or dropped from it, fails here; add it below when you add it.
ALGORITHMS = {
    "allreduce": {"ring", "halving_doubling", "recursive_doubling", "binomial_tree", "double_binary_tree"},
    "reduce_scatter": {"ring", "halving_doubling"},
    "allgather": {"ring", "bruck"},
    "broadcast": {"ring", "binomial_tree"},
    "reduce": {"ring", "binomial_tree"},
    "gather": {"binomial_tree", "linear"},
    "scatter": {"binomial_tree", "linear"},
    "alltoall": {"pairwise", "linear"},
}
ROOTED = {"broadcast", "reduce", "gather", "scatter"}
FORWARD_US = 300  # bench_pipeline's sleeping stages: a forward per micro-batch (a backward twice that)
WHOLE_VECTOR = {"allreduce", "broadcast", "reduce"}  # nccl-tests' size: the vector; else all blocks


class Failure(Exception):
    pass


def expect(condition, message):
    if not condition:
        raise Failure(message)


def close(a, b, abs_tol, rel_tol=1e-3):
    return math.isfinite(a) and math.isfinite(b) and abs(a - b) <= abs_tol + rel_tol * max(abs(a), abs(b))


def launched(args, ranks, cmd):
    """`cmd` under dtrain-run, which stops every rank past its time limit."""
    return [args.launcher, "-n", str(ranks), "--time-limit", "100"] + cmd


def run(cmd, env=None, timeout=120):
    """The program's stdout, with dtrain-run's "[rank] " prefixes removed; fails on a non-zero exit."""
    full_env = dict(os.environ, **(env or {}))
    p = subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise Failure(f"{' '.join(cmd)} exited {p.returncode}\n--- stdout\n{p.stdout}\n--- stderr\n{p.stderr}")
    return [re.sub(r"^\[\d+\] ", "", line) for line in p.stdout.splitlines()]


def header(lines, first_column):
    """The column names of the first '#' line whose first name is `first_column`."""
    for line in lines:
        names = line.lstrip("# ").split()
        if line.startswith("#") and names and names[0] == first_column:
            return names
    raise Failure(f"no header line starting with {first_column!r} in:\n" + "\n".join(lines))


def rows(lines, width):
    """The table's data lines (indented, starting with a number) split into `width` fields."""
    out = []
    for line in lines:
        if line.startswith("  ") and line.split() and line.split()[0][0].isdigit():
            out.append(line.split())
    expect(out, "no data rows in:\n" + "\n".join(lines))
    for r in out:
        expect(len(r) == width, f"a row of {len(r)} fields, not {width}: {r}")
    return out


def load(path):
    expect(os.path.exists(path), f"the benchmark wrote no JSON to {path}")
    with open(path) as f:
        return json.load(f)


def sizes(lo, hi, factor):
    out = [lo]
    while out[-1] * factor <= hi:
        out.append(out[-1] * factor)
    return out


def busbw_factor(op, p):
    """nccl-tests' bus-bandwidth factors (its doc/PERFORMANCE.md)."""
    if op == "allreduce":
        return 2 * (p - 1) / p
    if op in ("reduce_scatter", "allgather", "alltoall", "gather", "scatter"):
        return (p - 1) / p
    return 1.0


def check_collectives(args, transport, ranks):
    lo, hi, factor = (4, 65536, 128) if transport == "inproc" else (1024, 16384, 16)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "c.json")
        cmd = [os.path.join(args.bench_dir, "bench_collectives"), "--transport", transport, "-b", str(lo), "-e",
               str(hi), "-f", str(factor), "-t", "0.002", "--json", out]
        cmd = cmd + ["-n", str(ranks)] if transport == "inproc" else launched(args, ranks, cmd)
        lines = run(cmd)
        data = load(out)
    expect(header(lines, "size(B)") == ["size(B)", "count", "type", "redop", "root", "|", "time(us)", "algbw",
                                        "busbw", "#wrong", "op/algorithm"],
           f"bench_collectives' columns are not nccl-tests': {header(lines, 'size(B)')}")
    table = rows(lines, 11)
    expect(len(table) == len(data), f"{len(table)} table rows but {len(data)} JSON rows")
    seen = {}
    for t, j in zip(table, data):
        op, algo = t[10].split("/")
        where = f"{op}/{algo} at {j['bytes']} B"
        expect((op, algo) == (j["op"], j["algorithm"]), f"table row {t} against JSON {j}")
        expect(j["time_us"] > 0, f"{where}: time {j['time_us']} us")
        expect(j["ranks"] == ranks and j["type"] == "float32", f"{where}: {j['ranks']} ranks, {j['type']}")
        expect(j["wrong"] == 0 and t[9] == "0", f"{where}: {j['wrong']} wrong elements")
        expect(j["redop"] == ("sum" if op in ("allreduce", "reduce_scatter", "reduce") else "none"),
               f"{where}: redop {j['redop']}")
        expect(t[4] == ("0" if op in ROOTED else "-"), f"{where}: root column {t[4]}")
        requested = None
        for s in sizes(lo, hi, factor):
            count = s // 4 if op in WHOLE_VECTOR else max(1, s // 4 // ranks)
            if j["count"] == count and j["bytes"] == (count if op in WHOLE_VECTOR else count * ranks) * 4:
                requested = s
        expect(requested is not None, f"{where}: count {j['count']} fits no requested size")
        seen.setdefault((op, algo), []).append(requested)
        expect(close(j["algbw_GBps"], j["bytes"] / j["time_us"] / 1e3, 1e-4),
               f"{where}: algbw {j['algbw_GBps']} is not bytes / time")
        expect(close(j["busbw_GBps"], j["algbw_GBps"] * busbw_factor(op, ranks), 1e-4),
               f"{where}: busbw {j['busbw_GBps']} is not algbw * nccl-tests' factor for {op} at {ranks} ranks")
        for column, key, digits in ((6, "time_us", 1), (7, "algbw_GBps", 3), (8, "busbw_GBps", 3)):
            expect(close(float(t[column]), j[key], 0.6 * 10**-digits, 0),
                   f"{where}: the table's {t[column]} against the JSON's {key} {j[key]}")
        expect(int(t[0]) == j["bytes"] and int(t[1]) == j["count"], f"{where}: table {t[:2]}")
    expect({o for (o, _) in seen} == set(ALGORITHMS), f"collectives {sorted({o for (o, _) in seen})}")
    for op, algos in ALGORITHMS.items():
        found = {a for (o, a) in seen if o == op}
        expect(found == algos, f"{op}: the benchmark ran {sorted(found)}, the library has {sorted(algos)}")
    for key, got in seen.items():
        expect(got == sizes(lo, hi, factor), f"{key[0]}/{key[1]}: sizes {got}")
    expect(any(re.fullmatch(rf"# {len(data)} points, 0 wrong elements", line) for line in lines),
           f"no summary line '# {len(data)} points, 0 wrong elements'")
    return f"{len(data)} points, {len(ALGORITHMS)} collectives, {transport}, {ranks} ranks"


def check_ps(args, extra, servers=2, workers=2):
    requested = [4096, 65540]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "ps.json")
        cmd = [os.path.join(args.bench_dir, "bench_ps"), "--seconds", "0.02", "--sizes"] + [str(s) for s in requested]
        lines = run(launched(args, servers + workers, cmd + ["--keys", "100", "--json", out] + extra),
                    env={"DTRAIN_PS_SERVERS": str(servers)})
        data = load(out)
    expect(header(lines, "op") == ["op", "size(B)", "keys", "time(us)", "GB/s", "Mkeys/s", "#wrong"],
           f"bench_ps' columns: {header(lines, 'op')}")
    # Each worker pushes a last tensor 3 times and must find exactly its own 3 pushes (worker 0 reports).
    expect("# exactly once: 0 wrong values of worker 0" in lines, "no '# exactly once: 0 wrong values' line")
    expect("# values of worker 0 past float's exact range, not judged: 0" in lines,
           "bench_ps left values unjudged (or no longer says how many)")
    if "--replicas" in extra:  # every server forwarded updates down its chain
        chains = [int(m.group(1)) for m in (re.match(r"# server \d+: (\d+) updates down its chain", x) for x in lines)
                  if m]
        expect(len(chains) == servers and all(c > 0 for c in chains), f"servers' forwarded updates: {chains}")
    want = [(f"dense {w}", s) for s in requested for w in ("push", "pull", "push+pull")]
    if "--only" not in extra:
        want.append(("sparse push+pull", None))
    expect([(j["op"], j["bytes"] if j["keys"] == 0 else None) for j in data] == want,
           f"bench_ps measured {[(j['op'], j['bytes']) for j in data]}, not {want}")
    table = [x.split() for x in lines if x.startswith("  ") and (x.split() or [""])[0] in ("dense", "sparse")]
    expect(len(table) == len(data), f"{len(table)} table rows but {len(data)} JSON rows")
    for t, j in zip(table, data):
        where = f"{j['op']} at {j['bytes']} B"
        expect(" ".join(t[:-6]) == j["op"] and int(t[-6]) == j["bytes"] and int(t[-5]) == j["keys"]
               and int(t[-1]) == j["wrong"] and close(float(t[-4]), j["time_us"], 0.06, 0)
               and close(float(t[-3]), j["GBps"], 6e-4, 0) and close(float(t[-2]), j["Mkeys_per_s"], 6e-3, 0),
               f"{where}: the table's {t} against the JSON's {j}")
        expect(j["wrong"] == 0, f"{where}: {j['wrong']} wrong values")
        expect(j["time_us"] > 0, f"{where}: time {j['time_us']} us")
        expect((j["servers"], j["workers"]) == (servers, workers), f"{where}: {j['servers']}+{j['workers']}")
        both = 2 if j["op"].endswith("push+pull") else 1
        expect(close(j["GBps"], both * j["bytes"] * workers / j["time_us"] / 1e3, 1e-4),
               f"{where}: GB/s {j['GBps']} is not the bytes every worker moved / time")
        if j["keys"]:
            expect(0 < j["keys"] <= 100 and j["bytes"] == 4 * j["keys"], f"{where}: {j['keys']} keys")
            expect(close(j["Mkeys_per_s"], j["keys"] * workers / j["time_us"], 1e-3),
                   f"{where}: Mkeys/s {j['Mkeys_per_s']} is not keys * workers / time")
    return f"{len(data)} rows, {servers}+{workers} {' '.join(extra)}"


def check_pipeline(args, p=3):
    with tempfile.TemporaryDirectory() as tmp:
        table_json, timeline_json = os.path.join(tmp, "p.json"), os.path.join(tmp, "t.json")
        prog = [os.path.join(args.bench_dir, "bench_pipeline"), "--forward-us", str(FORWARD_US)]
        lines = run(launched(args, p, prog + ["--rounds", "1", "--steps", "1", "--micro-batches", "1,4", "--json",
                                              table_json]))
        run(launched(args, p, prog + ["--micro-batches", "3", "--timeline", timeline_json]))
        points, timelines = load(table_json), load(timeline_json)
    schedules = ["gpipe", "one_f_one_b", "interleaved_one_f_one_b", "pipedream"]
    expect([(x["schedule"], x["m"]) for x in points] == [(s, m) for m in (1, 4) for s in schedules],
           f"points {[(x['schedule'], x['m']) for x in points]}")
    for x in points:
        where = f"{x['schedule']} m={x['m']}"
        v = 2 if x["schedule"].startswith("interleaved") else 1
        expect(x["p"] == p and x["v"] == v, f"{where}: p {x['p']} v {x['v']}")
        expect(close(x["formula"], (p - 1) / (v * x["m"] + p - 1), 1e-5, 0), f"{where}: formula {x['formula']}")
        expect(0 <= x["bubble"] < 1 and 0 <= x["model"] < 1, f"{where}: bubble {x['bubble']} model {x['model']}")
        expect(0 < x["peak_live"] <= x["promised_peak"],
               f"{where}: {x['peak_live']} activations alive, more than the schedule's {x['promised_peak']}")
        if v == 1:  # GPipe keeps every micro-batch's; 1F1B and PipeDream min(p, m) on the first stage
            peak = x["m"] if x["schedule"] == "gpipe" else min(p, x["m"])
            expect(x["peak_live"] == x["promised_peak"] == peak, f"{where}: peak {x['peak_live']}, not {peak}")
    table = [x.split() for x in lines if x.startswith("  ") and len(x.split()) == 11]
    expect([(t[0], int(t[3]), int(t[8]), int(t[9])) for t in table]
           == [(x["schedule"], x["m"], x["peak_live"], x["promised_peak"]) for x in points]
           and all(close(float(t[c]), x[k], 6e-5, 0) for t, x in zip(table, points)
                   for c, k in ((4, "bubble"), (5, "formula"), (7, "model"))),
           "the table and its JSON differ")
    expect([t["schedule"] for t in timelines] == schedules, f"timelines {[t['schedule'] for t in timelines]}")
    for t in timelines:
        v = 2 if t["schedule"].startswith("interleaved") else 1
        expect((t["p"], t["v"], t["m"]) == (p, v, 3), f"{t['schedule']}: p {t['p']} v {t['v']} m {t['m']}")
        check_timeline(t, p)
    return f"{len(points)} points, {len(timelines)} timelines, p={p}"


def check_timeline(t, p):
    """Every micro-batch's forward and backward once on each stage, on the stage's rank, in the order
    the data flows (times from one clock, in ms, to the microsecond)."""
    stages, m = p * t["v"], t["m"]
    runs = {}
    for rank, stage, mb, forward, start, end in t["runs"]:
        key = (int(stage), int(mb), bool(forward))
        expect(key not in runs, f"{t['schedule']}: stage {stage} micro-batch {mb} ran twice")
        # A stage sleeps forward_us / v per forward, twice that per backward (ms, to the microsecond).
        least = FORWARD_US / 1000 / t["v"] * (1 if forward else 2) - 1e-3
        expect(rank == stage % p and end - start >= least,
               f"{t['schedule']}: {[rank, stage, mb, forward, start, end]} ran under its {least} ms")
        runs[key] = (start, end)
    expect(len(runs) == 2 * stages * m, f"{t['schedule']}: {len(runs)} runs, not {2 * stages * m}")
    for mb in range(m):
        for s in range(stages):
            order = [((s - 1, mb, True), (s, mb, True))] if s else []  # forward flows down the stages
            if s + 1 < stages:
                order.append(((s + 1, mb, False), (s, mb, False)))  # the gradient flows back up
            else:
                order.append(((s, mb, True), (s, mb, False)))  # the last stage turns around
            for first, then in order:
                expect(runs[first][1] <= runs[then][0] + 1e-3,
                       f"{t['schedule']}: {then} started at {runs[then][0]} before {first} ended at {runs[first][1]}")


def check_tcp_latency(args):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "l.json")
        lines = run(launched(args, 2, [os.path.join(args.bench_dir, "bench_tcp_latency"), "-b", "8", "-e", "65536",
                                       "-f", "8", "-i", "50", "--json", out]))
        data = load(out)
    expect(header(lines, "size(B)") == ["size(B)", "progress", "|", "one-way(us)", "#wrong"],
           f"bench_tcp_latency's columns: {header(lines, 'size(B)')}")
    table = rows(lines, 5)
    want = [(s, pol) for pol in ("blocking", "spin_then_block<1000>") for s in sizes(8, 65536, 8)]
    expect([(j["bytes"], j["progress"]) for j in data] == want, f"points {[(j['bytes'], j['progress']) for j in data]}")
    expect(len(table) == len(data), f"{len(table)} table rows but {len(data)} JSON rows")
    for t, j in zip(table, data):
        expect(j["wrong"] == 0 and t[4] == "0", f"{j}: the message came back changed")
        expect(j["one_way_us"] > 0 and close(float(t[3]), j["one_way_us"], 0.006, 0), f"table {t} against {j}")
    return f"{len(data)} points"


def check_host_reduce(args):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.json")
        lines = run([os.path.join(args.bench_dir, "bench_host_reduce"), "--mib", "1", "--reps", "2", "--json", out])
        data = load(out)
    expect(data["mib"] == 1 and data["wrong"] == 0, f"{data['wrong']} wrong elements")
    expect("# 0 wrong elements (every op and type against a scalar loop)" in lines, "no '# 0 wrong elements' line")
    for key in ("plain_add_GBps", "host_reduction_GBps", "memcpy_GBps"):
        expect(data[key] > 0, f"{key} {data[key]}")
    expect(close(data["ratio_to_plain"], data["host_reduction_GBps"] / data["plain_add_GBps"], 1e-3, 2e-3),
           f"ratio_to_plain {data['ratio_to_plain']} is not the two bandwidths' ratio")
    types = ["float32", "float64", "int32", "int64", "float16", "bfloat16"]
    expect([r["type"] for r in data["by_type"]] == types, f"types {[r['type'] for r in data['by_type']]}")
    ops = ["sum", "prod", "min", "max", "avg"]
    expect(any(x.split() == ["type"] + ops for x in lines), "no table header 'type sum prod min max avg'")
    table = {x.split()[0]: x.split()[1:] for x in lines if x.split() and x.split()[0] in types}
    for r in data["by_type"]:
        for op, printed in zip(ops, table.get(r["type"], [])):
            expect(r[op] > 0 and close(float(printed), r[op], 0.006, 0), f"{r['type']} {op}: {printed} and {r[op]}")
        expect(len(table.get(r["type"], [])) == len(ops), f"{r['type']}: table row {table.get(r['type'])}")
    return f"{len(types)} types x 5 operations"


def check_tcp_ceiling(args):
    requested = [4096, 65536]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "c.json")
        lines = run([os.path.join(args.bench_dir, "bench_tcp_ceiling"), "--seconds", "0.02", "--sizes"]
                    + [str(s) for s in requested] + ["--json", out])
        data = load(out)
    expect(header(lines, "op") == ["op", "size(B)", "time(us)", "GB/s"], f"columns {header(lines, 'op')}")
    want = [(f"tcp {w}", s) for s in requested for w in ("push", "pull", "push+pull")]
    expect([(j["op"], j["bytes"]) for j in data] == want, f"rows {[(j['op'], j['bytes']) for j in data]}")
    table = [x.split() for x in lines if x.startswith("  tcp ")]
    expect(len(table) == len(data), f"{len(table)} table rows but {len(data)} JSON rows")
    for t, j in zip(table, data):
        both = 2 if j["op"].endswith("push+pull") else 1
        expect(j["time_us"] > 0 and close(j["GBps"], both * j["bytes"] / j["time_us"] / 1e3, 1e-4),
               f"{j}: GB/s is not bytes / time")
        expect(" ".join(t[:-3]) == j["op"] and int(t[-3]) == j["bytes"] and close(float(t[-2]), j["time_us"], 0.06, 0)
               and close(float(t[-1]), j["GBps"], 6e-4, 0), f"the table's {t} against the JSON's {j}")
    return f"{len(data)} rows"


def check_simulate_scale(args):
    ranks, per_host, requested = [4, 8], [1, 2], sizes(4096, 65536, 4)
    flat = ALGORITHMS["allreduce"]
    with tempfile.TemporaryDirectory() as tmp:
        out, predicted = os.path.join(tmp, "s.json"), os.path.join(tmp, "p.json")
        table_lines = run([os.path.join(args.bench_dir, "simulate_scale"), "--ranks", "4,8", "--per-host", "1,2", "-b",
                           "4096", "-e", "65536", "-f", "4", "--json", out])
        lines = run([os.path.join(args.bench_dir, "simulate_scale"), "--predict", "--hosts", "3", "--per-host", "2",
                     "-b", "1024", "-e", "65536", "-f", "8", "--json", predicted])
        table, shape = load(out), load(predicted)
    for j in table + shape:
        where = f"{j['algorithm']} on {j['hosts']}x{j['per_host']} at {j['bytes']} B"
        p = j["ranks"]
        expect(j["op"] == "allreduce" and p == j["hosts"] * j["per_host"], f"{where}: {p} ranks")
        expect(j["time_us"] > 0 and close(j["busbw_GBps"], j["bytes"] / j["time_us"] / 1e3 * 2 * (p - 1) / p, 1e-4),
               f"{where}: busbw {j['busbw_GBps']} is not bytes / time * 2(P-1)/P")
    # Every world size, ranks per host and size asked for, by every flat algorithm, and in two levels
    # where hosts hold several ranks.
    got = sorted((j["ranks"], j["per_host"], j["bytes"], j["algorithm"]) for j in table)
    want = sorted((p, l, b, a) for p in ranks for l in per_host for b in requested
                  for a in (flat | {"hierarchical"} if l > 1 else flat))
    expect(got == want, f"simulate_scale predicted {len(got)} points, not the {len(want)} asked for")
    # Its table: one row per (size, P, L), each busbw as in the JSON, and the fastest named.
    busbw = {(j["bytes"], j["ranks"], j["per_host"], j["algorithm"]): j["busbw_GBps"] for j in table}
    names = ["ring", "halving_doubling", "recursive_doubling", "binomial_tree", "double_binary_tree", "hierarchical"]
    size, checked = None, set()
    for line in table_lines:
        m = re.match(r"# allreduce of (\d+) bytes", line)
        if m:
            size = int(m.group(1))
        f = line.split()
        if size is None or not line.startswith("  ") or len(f) != 12:
            continue
        p, l = int(f[0]), int(f[2])
        row = {a: float(x) for a, x in zip(names, f[4:10]) if x != "-"}
        for a, x in row.items():
            expect(close(x, busbw[(size, p, l, a)], 6e-5, 0), f"{a} at {size} B, P={p}, L={l}: {x} in the table")
        best = max(busbw[(size, p, l, a)] for a in row)  # ties within the printed digits may go either way
        expect(f[11] in row and busbw[(size, p, l, f[11])] >= best - 1e-4,
               f"at {size} B, P={p}, L={l} the table names {f[11]} fastest: {row}")
        expect((size, p, l) not in checked, f"the table has ({size} B, P={p}, L={l}) twice")
        checked.add((size, p, l))
    expect(checked == {(b, p, l) for b in requested for p in ranks for l in per_host}, f"table rows {sorted(checked)}")
    got = sorted({(j["bytes"], j["algorithm"]) for j in shape})
    expect(all((j["hosts"], j["per_host"], j["ranks"]) == (3, 2, 6) for j in shape), "--predict's shape")
    expect(got == sorted((s, a) for s in sizes(1024, 65536, 8) for a in flat | {"hierarchical"}),
           f"--predict gave {got}")
    expect(header(lines, "size") == ["size", "count", "type", "redop", "algorithm", "|", "time(us)", "algbw", "busbw"],
           f"simulate_scale --predict's columns: {header(lines, 'size')}")
    expect(len(rows(lines, 9)) == len(shape), "the --predict table and its JSON differ in length")
    for t, j in zip(rows(lines, 9), shape):
        expect((int(t[0]), t[4]) == (j["bytes"], j["algorithm"]) and close(float(t[6]), j["time_us"], 0.06, 0),
               f"the --predict table's {t} against its JSON {j}")
    return f"{len(table)} predictions and {len(checked)} table rows, {len(shape)} for one shape"


CASES = {
    "collectives_inproc": lambda a: check_collectives(a, "inproc", 3),
    "collectives_shm": lambda a: check_collectives(a, "shm", 3),
    "collectives_tcp": lambda a: check_collectives(a, "tcp", 3),
    "ps": lambda a: check_ps(a, []),
    "ps_replicated": lambda a: check_ps(a, ["--only", "dense", "--depth", "2", "--replicas", "2", "--slice-kib", "4"]),
    "pipeline": check_pipeline,
    "tcp_latency": check_tcp_latency,
    "host_reduce": check_host_reduce,
    "tcp_ceiling": check_tcp_ceiling,
    "simulate_scale": check_simulate_scale,
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench-dir", required=True)
    parser.add_argument("--launcher", required=True, help="dtrain-run")
    parser.add_argument("case", choices=sorted(CASES))
    args = parser.parse_args()
    try:
        print(f"bench {args.case}: ok ({CASES[args.case](args)})")
    except Exception as e:  # noqa: BLE001 (any error is the benchmark's failure, told with its type)
        print(f"bench {args.case}: FAILED: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

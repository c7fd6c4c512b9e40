#!/usr/bin/env python3
"""The harness of the tests that run dtrain's torch.distributed backend against Gloo: a launcher
that starts the ranks as processes of the running script (or under torchrun) and counts their
verdicts, a checker that compares each call's result with Gloo's or a known reference, and the
inputs every rank can compute for every other. c10d_against_gloo.py and the other test files
here import it."""

import argparse
import os
import random
import signal
import socket
import subprocess
import sys
import time


LAUNCH_DEADLINE_S = 240


def free_port():
    """A free port below Linux's ephemeral range (32768 up): one picked from that range could be
    handed to another process's socket between this check and the rendezvous binding it."""
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(200):
        port = rng.randrange(20000, 32768)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    sys.exit("no free port in 20000-32767")


def launch_torchrun(args, port):
    """The ranks under torchrun (static rendezvous on `port`); every rank's verdict is in its output."""
    script = [os.path.abspath(sys.argv[0])] + (["--module-dir", args.module_dir] if args.module_dir else [])
    # Debian's torchrun (torch 1.13) under Python 3.11 reads --redirects/--tee "0" (its default) as
    # None and fails; "1" (stdout to a log file, and teed here) parses.
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", str(args.ranks),
           "--master_addr", "127.0.0.1", "--master_port", str(port), "--redirects", "1", "--tee", "1"] + script
    try:
        done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=LAUNCH_DEADLINE_S)
        code, out = done.returncode, done.stdout
    except subprocess.TimeoutExpired as e:
        partial = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        code, out = -1, partial + f"\n(killed after {LAUNCH_DEADLINE_S} s)"
    sys.stdout.write(out)
    verdicts = sum(f"rank {r}: PASS" in out for r in range(args.ranks)) if code == 0 else 0
    print(f"torchrun exited {code}; {verdicts} of {args.ranks} ranks passed")
    return 0 if verdicts == args.ranks else 1


def launch(args):
    """Starts --ranks processes of the running script and counts their verdicts. The other test
    files share it: their `args` need only `ranks` (no --launcher, no --kill)."""
    port = free_port()
    if getattr(args, "launcher", "self") == "torchrun":
        return launch_torchrun(args, port)
    procs = []
    for r in range(args.ranks):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(args.ranks), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable] + sys.argv, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    deadline = time.monotonic() + LAUNCH_DEADLINE_S
    outputs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out, _ = p.communicate()
            out += f"\n(killed after {LAUNCH_DEADLINE_S} s)"
        outputs.append((p.returncode, out))
    verdicts = 0
    for r, (code, out) in enumerate(outputs):
        sys.stdout.write(f"--- rank {r} (exit {code})\n{out}")
        victim = getattr(args, "kill", False) and r == args.ranks - 1
        if victim:
            verdicts += code == -signal.SIGKILL
        else:
            verdicts += code == 0 and f"rank {r}: PASS" in out
    print(f"{verdicts} of {args.ranks} ranks gave the expected verdict")
    return 0 if verdicts == args.ranks else 1


def launch_or_run(doc, rank_main, ranks=2):
    """The main() of a test file whose options are --ranks and --module-dir: in a rank (RANK set)
    runs rank_main(args), else launches the ranks."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=ranks)
    p.add_argument("--module-dir", help="where dtrain_torch's module was built")
    args = p.parse_args()
    return rank_main(args) if "RANK" in os.environ else launch(args)


class Checker:
    def __init__(self, rank):
        self.rank, self.passed, self.failed = rank, 0, []

    def same(self, name, got, want, exact):
        import torch
        if exact:
            ok = torch.equal(got, want)
        else:  # allclose alone would broadcast
            ok = got.shape == want.shape and torch.allclose(got.double(), want.double(), rtol=1e-5, atol=1e-5)
        if ok:
            self.passed += 1
        else:
            self.failed.append(name)
            print(f"rank {self.rank}: FAIL {name}: got {got.flatten()[:8].tolist()} want {want.flatten()[:8].tolist()}",
                  flush=True)

    def true(self, name, cond, detail=""):
        if cond:
            self.passed += 1
        else:
            self.failed.append(name)
            print(f"rank {self.rank}: FAIL {name} {detail}", flush=True)


def finish(c, dist, gloo, rank):
    """Every rank past its checks, the group destroyed, then this rank's verdict, which the
    launcher counts. @returns the rank's exit status."""
    dist.barrier(group=gloo)
    dist.destroy_process_group()
    verdict = "PASS" if not c.failed and c.passed > 0 else "FAIL"
    print(f"rank {rank}: {verdict} ({c.passed} checks passed, {len(c.failed)} failed: {c.failed})", flush=True)
    return 0 if verdict == "PASS" else 1


def input_of(rank, shape, dtype, kind="any"):
    """Rank `rank`'s input: deterministic, so any rank can compute another's."""
    import torch
    g = torch.Generator().manual_seed(1000 + rank)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        if kind == "prod":
            return (torch.rand(shape, generator=g) + 0.5).to(dtype)
        return (torch.randn(shape, generator=g) * 4).to(dtype)
    low, high = (1, 3) if kind == "prod" else (-50 if dtype not in (torch.uint8,) else 0, 50)
    return torch.randint(low, high, shape, generator=g).to(dtype)

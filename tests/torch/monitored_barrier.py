#!/usr/bin/env python3
"""torch.distributed's monitored_barrier on dtrain, against Gloo's, in real processes:

    python3 monitored_barrier.py [--ranks 3] [--module-dir DIR]

Each case runs on a Gloo group and on the dtrain group in turn, with the same ranks late:
- every rank comes: both pass, with and without wait_all_ranks;
- rank 1 comes after the timeout: rank 0 says "Rank 1 failed to pass monitoredBarrier", ranks 1
  and 2 say they "successfully reached monitoredBarrier, but received errors while waiting for
  send/recv from rank 0" (Gloo's words, which torch's own tests match). On dtrain they say so
  as soon as rank 0 has decided, and name rank 1. (Under Gloo rank 2 says so and rank 1, late,
  finds the connections closed: "Connection closed by peer".)
- ranks 1 and 2 late: with wait_all_ranks rank 0 names both ("Ranks 1, 2"), on dtrain within the
  timeout (Gloo's rank 0 waits the timeout once per rank), without it only rank 1;
- rank 0 late: the others wait for it, and every rank passes;
- a timeout of zero: "Rank 0 timed out in monitoredBarrier";
- after all of it, the dtrain group passes a monitored barrier again and reduces correctly.
Times are read from the clock around each call. torch 1.13's dist.monitored_barrier refuses any
backend but Gloo, so there the test calls the group's own method, which 2.x's function calls.
The launcher passes only if every rank reports every check passed.
"""
import os
import re
import sys
import time
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from against_gloo import Checker, finish, launch_or_run  # noqa: E402

TIMEOUT = timedelta(seconds=1)
LATE_S = 3.0  # well past TIMEOUT: a late rank's call comes after rank 0 has given up
GLOO_GROUP_TIMEOUT = timedelta(seconds=5)  # how long Gloo's ranks wait for rank 0
REACHED = "Rank {} successfully reached monitoredBarrier, but received errors while waiting for send/recv from rank 0"


def attempt(group, timeout, wait_all=False):
    """@returns the error monitored_barrier raised (None: it passed) and the seconds it took."""
    start = time.monotonic()
    try:
        group.monitored_barrier(timeout, wait_all_ranks=wait_all)
        return None, time.monotonic() - start
    except RuntimeError as e:
        return str(e), time.monotonic() - start


def expect(c, name, got, pattern):
    error, took = got
    print(f"{name}: {took:.2f} s: {error!r}"[:400], flush=True)
    c.true(name, error is not None and re.search(pattern, error) is not None, f"({error!r} lacks {pattern!r})")


def cases(c, dist, rank, groups, backend, sync):
    """The cases, each on a group `groups()` gives; `sync` (another group) lines the ranks up
    between them. (Gloo closes its connections when a monitored barrier fails: a new group each.)"""
    dtrain = backend == "dtrain"
    group = groups()
    for wait_all in (False, True):
        error, _ = attempt(group, TIMEOUT, wait_all)
        c.true(f"{backend}: every rank came, wait_all_ranks={wait_all}: passes", error is None, repr(error))
    dist.barrier(group=sync)

    # Rank 1 late.
    group = groups()
    if rank == 1:
        time.sleep(LATE_S)
    got = attempt(group, TIMEOUT)
    if rank == 0:
        expect(c, f"{backend}: rank 0 names the late rank", got, "Rank 1 failed to pass monitoredBarrier")
        c.true(f"{backend}: rank 0 waited its timeout, not for the late rank", 0.9 < got[1] < 2.5, f"({got[1]:.2f} s)")
    elif rank == 2 or dtrain:  # Gloo's late rank finds its connections closed ("Connection closed by peer")
        expect(c, f"{backend}: rank {rank} was released with an error", got, REACHED.format(rank))
        if dtrain:  # rank 0's verdict reaches them as soon as it is made; rank 1 gets it on arrival
            c.true("dtrain: the verdict names the late rank", "rank 0 found that rank 1 did not reach it" in got[0],
                   repr(got[0]))
            c.true(f"dtrain: rank {rank} heard it without waiting for a timeout", got[1] < (2.5 if rank == 2 else 1.5),
                   f"({got[1]:.2f} s)")
    dist.barrier(group=sync)

    # Ranks 1 and 2 late: with wait_all_ranks both named, without it the first.
    for wait_all, named in ((True, "Ranks 1, 2 failed to pass monitoredBarrier"),
                            (False, "Rank 1 failed to pass monitoredBarrier")):
        group = groups()
        if rank != 0:
            time.sleep(LATE_S)
        got = attempt(group, TIMEOUT, wait_all=wait_all)
        if rank == 0:
            expect(c, f"{backend}: rank 0 names the late ranks, wait_all_ranks={wait_all}", got, named)
            c.true(f"{backend}: rank 0 names no more, wait_all_ranks={wait_all}", wait_all or "Ranks" not in got[0])
            if dtrain:
                c.true("dtrain: rank 0 waited the timeout once", got[1] < 2.5, f"({got[1]:.2f} s)")
        else:  # Gloo's late ranks find the connections closed: any error will do there
            expect(c, f"{backend}: late rank {rank} was released with an error", got,
                   REACHED.format(rank) if dtrain else ".")
        dist.barrier(group=sync)

    # Rank 0 late: the others wait for it (only rank 0's timeout applies), and every rank passes.
    group = groups()
    if rank == 0:
        time.sleep(LATE_S)
    error, _ = attempt(group, TIMEOUT)
    c.true(f"{backend}: rank 0 late, rank {rank} passes", error is None, repr(error))
    dist.barrier(group=sync)

    # A timeout of zero: rank 0 has no time to wait (Gloo's other ranks would wait for the group's
    # timeout, so only rank 0 calls there, as in torch's test).
    group = groups()
    if rank == 0 or dtrain:
        got = attempt(group, timedelta(seconds=0))
        expect(c, f"{backend}: a zero timeout at rank {rank}", got, f"Rank {rank} timed out in monitoredBarrier")
    dist.barrier(group=sync)


def rank_main(args):
    rank = int(os.environ["RANK"])
    if args.module_dir:
        sys.path.insert(0, args.module_dir)
    import torch
    import torch.distributed as dist
    import dtrain_torch  # noqa: F401  (registers the backend)

    size = int(os.environ["WORLD_SIZE"])
    c = Checker(rank)
    dist.init_process_group("dtrain", init_method="env://", timeout=timedelta(seconds=20))
    sync = dist.new_group(list(range(size)), backend="gloo")
    default = dist.distributed_c10d._get_default_group()
    cases(c, dist, rank, lambda: dist.new_group(list(range(size)), backend="gloo", timeout=GLOO_GROUP_TIMEOUT),
          "gloo", sync)
    cases(c, dist, rank, lambda: default, "dtrain", sync)

    error, _ = attempt(default, TIMEOUT)
    c.true("dtrain: the group passes a monitored barrier after the failed ones", error is None, repr(error))
    if tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 0):
        dist.monitored_barrier(timeout=TIMEOUT)  # torch 2 lets any CPU backend take the function
    x = torch.full((5,), float(rank + 1))
    dist.all_reduce(x)
    c.same("dtrain: the group reduces correctly after them", x, torch.full((5,), size * (size + 1) / 2), exact=True)
    return finish(c, dist, sync, rank)


if __name__ == "__main__":
    sys.exit(launch_or_run(__doc__, rank_main, ranks=3))

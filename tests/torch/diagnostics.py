#!/usr/bin/env python3
"""What the backend tells a user and torch's tools, in real processes:

    python3 diagnostics.py [--ranks 2] [--module-dir DIR]

Each rank checks, against what it can observe itself (its own stderr, read back from a file; a
logging handler; the profiler's events; Gloo's events for the same calls):
- dtrain's diagnostics go to stderr ("dtrain info: ..." under DTRAIN_LOG=info), and after
  dtrain_torch.log_to_python() to the logger "dtrain" at Python's level, and not to stderr;
- work.wait(timeout) that runs out names the call, the rank and where the call is (queued, running
  as dtrain's collective number N, posted), and the work still completes with the right result;
- c10d's sequence numbers count the group's collectives, alike on every rank;
- torch's profiler records every call as "dtrain:<call>" with the call's input shapes (checked
  against the shapes the calls were given), event for event as it records Gloo's "gloo:<call>" in
  the same run.
The ranks say they are on different hosts (DTRAIN_HOST_ID), so their groups form over TCP and
log the addresses they listen on. The launcher passes only if every rank reports every check passed.
"""
import logging
import os
import sys
import tempfile
import time
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from against_gloo import Checker, finish, launch_or_run  # noqa: E402


def logs(c, dist, dtrain_torch, rank):
    """The same line, to stderr and then to Python's logging."""
    err = tempfile.TemporaryFile(mode="w+")
    saved = os.dup(2)
    os.dup2(err.fileno(), 2)  # dtrain writes to file descriptor 2
    try:
        dist.init_process_group("dtrain", init_method="env://", timeout=timedelta(seconds=30))
        # torch 1.13's init ends in a store-based barrier whose last poll may come after rank 0 has
        # returned: were rank 0 to destroy the group (and its TCPStore) now, that poll would fail.
        dist.barrier()
        dist.destroy_process_group()
        to_stderr = err.tell()
        records = []

        class Keep(logging.Handler):
            def emit(self, record):
                records.append(record)

        logger = logging.getLogger("dtrain")
        logger.setLevel(logging.DEBUG)
        logger.addHandler(Keep())
        dtrain_torch.log_to_python()
        # A fresh store: rank 0's first one may still be up, with the first group's keys in it.
        again = f"file://{tempfile.gettempdir()}/dtrain_diagnostics_{os.environ['MASTER_PORT']}_{os.getppid()}"
        dist.init_process_group("dtrain", init_method=again, rank=rank, world_size=int(os.environ["WORLD_SIZE"]),
                                timeout=timedelta(seconds=30))
        deadline = time.monotonic() + 5
        while not any("listens on" in r.getMessage() for r in records) and time.monotonic() < deadline:
            time.sleep(0.01)  # the lines reach logging on the module's thread
        err.seek(0)
        text = err.read()
    finally:
        os.dup2(saved, 2)
    c.true("the listen line on stderr", f"dtrain info: rank {rank} listens on" in text, repr(text[:300]))
    routed = [r for r in records if f"rank {rank} listens on" in r.getMessage()]
    c.true("the listen line in logging at INFO", len(routed) == 1 and routed[0].levelno == logging.INFO,
           str([(r.levelname, r.getMessage()) for r in records]))
    c.true("no dtrain line on stderr once routed", "dtrain " not in text[to_stderr:], repr(text[to_stderr:]))
    dtrain_torch.log_to_python(False)


def expect_timeout(c, name, work, wanted):
    try:
        work.wait(timedelta(milliseconds=200))
        c.true(name, False, "(wait returned)")
    except RuntimeError as e:
        text = str(e)
        print(f"{name}: {text}", flush=True)
        c.true(name, all(w in text for w in wanted), f"({text!r} lacks one of {wanted})")


def waits(c, dist, torch, rank, size, gloo):
    """work.wait(timeout) before rank 1 has called: each of a collective's states, and a receive."""
    dist.barrier(group=gloo)
    if rank != 0:
        time.sleep(1.5)
        x, y = torch.ones(8), torch.ones(8) * 2
        dist.all_reduce(x)
        dist.all_reduce(y)
        if rank == 1:
            dist.send(torch.arange(4.0), 0)
        return
    before = dist.distributed_c10d._get_default_group()._get_sequence_number_for_group()
    x, y = torch.ones(8), torch.ones(8) * 2
    first = dist.all_reduce(x, async_op=True)
    second = dist.all_reduce(y, async_op=True)
    expect_timeout(c, "a running collective's wait names it", first,
                   ["work.wait(timeout=200 ms)", "all_reduce at rank 0", "dtrain's collective #",
                    "destroy_process_group"])
    expect_timeout(c, "a queued collective's wait says so", second, ["all_reduce at rank 0", "queue"])
    got = torch.zeros(4)
    receive = dist.irecv(got, 1)
    expect_timeout(c, "a posted receive's wait names it", receive, ["recv from rank 1 (tag 0) at rank 0", "posted"])
    first.wait()
    second.wait()
    receive.wait()
    c.true("the works complete after all", torch.equal(x, torch.full((8,), float(size)))
           and torch.equal(y, torch.full((8,), 2.0 * size))
           and torch.equal(got, torch.arange(4.0)))
    after = dist.distributed_c10d._get_default_group()._get_sequence_number_for_group()
    c.true("two collectives and a receive, three sequence numbers", after == before + 3, f"({before} then {after})")


def sequence_numbers(c, dist, torch, rank, size, gloo):
    group = dist.distributed_c10d._get_default_group()
    if hasattr(group, "_set_sequence_number_for_group"):  # torch 1.13: the group is the backend
        group._set_sequence_number_for_group()
    else:  # torch 2: the group's backend sets it; the group reads it from there
        group._get_backend(torch.device("cpu"))._set_sequence_number_for_group()
    start = group._get_sequence_number_for_group()
    for _ in range(5):
        dist.all_reduce(torch.ones(3))
    dist.broadcast(torch.ones(3), 0)
    now = torch.tensor([start, group._get_sequence_number_for_group()])
    every = [torch.zeros(2, dtype=now.dtype) for _ in range(size)]
    dist.all_gather(every, now, group=gloo)
    c.true("sequence numbers count collectives", now.tolist() == [0, 6], str(now.tolist()))
    c.true("sequence numbers alike on every rank", all(torch.equal(e, now) for e in every), str(every))


def profiled(c, dist, torch, rank, size, gloo):
    def calls(group):
        x = torch.ones(16)
        dist.all_reduce(x, group=group)
        dist.broadcast(torch.ones(2, 5), 0, group=group)
        dist.all_gather([torch.zeros(3, 4) for _ in range(size)], torch.ones(3, 4), group=group)
        dist.all_reduce_coalesced([torch.ones(7), torch.ones(2, 2)], group=group)
        dist.all_gather_coalesced([[torch.zeros(5), torch.zeros(1, 6)] for _ in range(size)],
                                  [torch.ones(5), torch.ones(1, 6)], group=group)
        dist.all_to_all_single(torch.zeros(size * 3), torch.ones(size * 3), group=group)
        dist.reduce(torch.ones(3, 3), 0, group=group)
        dist.gather(torch.ones(2, 7), [torch.zeros(2, 7) for _ in range(size)] if rank == 0 else None, 0,
                    group=group)
        dist.scatter(torch.zeros(8), [torch.ones(8) for _ in range(size)] if rank == 1 else None, 1, group=group)
        dist.barrier(group=group)
        if rank == 0:
            dist.send(torch.ones(9), 1, group=group)
            dist.send(torch.ones(4, 2), 1, group=group)
        elif rank == 1:
            dist.recv(torch.zeros(9), 0, group=group)
            dist.recv(torch.zeros(4, 2), group=group)  # from any rank

    events = {}
    for backend, group in (("gloo", gloo), ("dtrain", None)):
        with torch.autograd.profiler.profile(record_shapes=True) as prof:
            calls(group)
        events[backend] = sorted((e.name.split(":", 1)[1], str(e.input_shapes)) for e in prof.function_events
                                 if e.name.startswith(backend + ":"))
    print(f"rank {rank}: profiled {events}", flush=True)
    c.true("Gloo records its calls (the check sees events)", len(events["gloo"]) >= 11, str(events))
    # Shapes recorded at all, and as the calls gave them (not only equal to Gloo's, which could be empty too).
    expected = {("all_reduce", "[[16]]"), ("broadcast", "[[2, 5]]"), ("all_gather", "[[5], [1, 6]]"),
                ("reduce", "[[3, 3]]"), ("gather", "[[2, 7]]")}
    expected |= {("scatter", "[[8], [8]]" if size == 2 else str([[8]] * size))} if rank == 1 else set()
    expected |= {("send", "[[9]]")} if rank == 0 else {("recvAnySource", "[[4, 2]]")} if rank == 1 else set()
    c.true("dtrain's events carry the calls' input shapes", expected <= set(events["dtrain"]),
           f"missing {expected - set(events['dtrain'])}")
    c.true("dtrain records every call as Gloo does: names and input shapes", events["gloo"] == events["dtrain"],
           str(events))


def rank_main(args):
    rank = int(os.environ["RANK"])
    os.environ["DTRAIN_HOST_ID"] = f"host{rank}"
    os.environ["DTRAIN_LOG"] = "info"
    if args.module_dir:
        sys.path.insert(0, args.module_dir)
    import torch
    import torch.distributed as dist
    import dtrain_torch

    size = int(os.environ["WORLD_SIZE"])
    c = Checker(rank)
    logs(c, dist, dtrain_torch, rank)  # leaves the default group formed
    gloo = dist.new_group(list(range(size)), backend="gloo")
    waits(c, dist, torch, rank, size, gloo)
    sequence_numbers(c, dist, torch, rank, size, gloo)
    profiled(c, dist, torch, rank, size, gloo)
    return finish(c, dist, gloo, rank)


if __name__ == "__main__":
    sys.exit(launch_or_run(__doc__, rank_main))

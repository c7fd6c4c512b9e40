#!/usr/bin/env python3
"""dtrain's torch.distributed backend against Gloo, in the style of PyTorch's c10d tests.

    python3 c10d_against_gloo.py --ranks 3 [--module-dir DIR]         # every collective
    python3 c10d_against_gloo.py --ranks 3 --kill [--module-dir DIR]  # a rank killed mid-allreduce
    python3 c10d_against_gloo.py --ranks 3 --launcher torchrun [--module-dir DIR]  # ranks from torchrun
    python3 c10d_against_gloo.py --ranks 2 --exit-without-destroy [--module-dir DIR]  # the group ends with Python

Run without RANK in the environment, it launches --ranks processes of itself (env:// rendezvous,
or tcp:// with --init tcp, on a free local port) and passes only if every rank reports every check
passed; under torchrun (RANK set) each rank runs the checks and exits non-zero on any failure. Each rank joins
the default group with backend "dtrain" and a Gloo group over the same ranks, runs each call on
both with the same inputs, and compares: bit for bit for integers and for min/max, within float
tolerance otherwise. Where Gloo lacks a call (reduce_scatter, list alltoall, AVG), the reference
is composed from Gloo's allreduce or computed from the other ranks' inputs, which are known.
"""
import argparse
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta

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
    script = [os.path.abspath(__file__)] + (["--module-dir", args.module_dir] if args.module_dir else [])
    # Debian's torchrun (torch 1.13) under Python 3.11 reads --redirects/--tee "0" (its default) as
    # None and fails; "1" (stdout to a log file, and teed here) parses.
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", str(args.ranks),
           "--master_addr", "127.0.0.1", "--master_port", str(port), "--redirects", "1", "--tee", "1"] + script
    try:
        done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=LAUNCH_DEADLINE_S)
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
        ok = torch.equal(got, want) if exact else (got.shape == want.shape  # allclose would broadcast
                                                    and torch.allclose(got.double(), want.double(), rtol=1e-5, atol=1e-5))
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


def collectives(c, dist, torch, gloo, size, rank):
    R = dist.ReduceOp
    floats = [torch.float32, torch.float64]
    ints = [torch.int32, torch.int64]
    shape = (5, 7)

    def exact(dtype, op=None):
        return not dtype.is_floating_point or (op is not None and op in (R.MIN, R.MAX))

    # allreduce: every op and dtype, against Gloo's on the same input
    for dtype in floats + ints:
        for name, op in (("SUM", R.SUM), ("PRODUCT", R.PRODUCT), ("MIN", R.MIN), ("MAX", R.MAX)):
            kind = "prod" if op == R.PRODUCT else "any"
            mine, ref = input_of(rank, shape, dtype, kind), input_of(rank, shape, dtype, kind)
            dist.all_reduce(mine, op=op)
            dist.all_reduce(ref, op=op, group=gloo)
            c.same(f"allreduce {dtype} {name}", mine, ref, exact(dtype, op))
    # AVG (Gloo has none): the sum over the ranks' known inputs, divided
    for dtype in floats:
        mine = input_of(rank, shape, dtype)
        dist.all_reduce(mine, op=R.AVG)
        want = sum(input_of(r, shape, torch.float64) for r in range(size)) / size
        c.same(f"allreduce {dtype} AVG", mine, want.to(dtype), False)
    # bitwise ops: on int32 and int64 against Gloo's; on bool and uint8 against the fold of the
    # ranks' known inputs; on floats refused, as Gloo refuses them
    bitwise = (("BAND", R.BAND, torch.bitwise_and), ("BOR", R.BOR, torch.bitwise_or), ("BXOR", R.BXOR, torch.bitwise_xor))
    for dtype in ints:
        for name, op, _ in bitwise:
            mine, ref = input_of(rank, shape, dtype), input_of(rank, shape, dtype)
            dist.all_reduce(mine, op=op)
            dist.all_reduce(ref, op=op, group=gloo)
            c.same(f"allreduce {dtype} {name}", mine, ref, True)
    for dtype in (torch.bool, torch.uint8):
        for name, op, fold in bitwise:
            mine = input_of(rank, shape, dtype)
            dist.all_reduce(mine, op=op)
            want = input_of(0, shape, dtype)
            for r in range(1, size):
                want = fold(want, input_of(r, shape, dtype))
            c.same(f"allreduce {dtype} {name}", mine, want, True)
    try:
        dist.all_reduce(torch.ones(3), op=R.BXOR)
        c.true("BXOR of floats refused", False, "no error")
    except RuntimeError as e:
        c.true("BXOR of floats refused", "bitwise and, or and xor reduce integers and bools" in str(e), str(e))
    # half precision: against the float32 sum of the same inputs
    for dtype in (torch.float16, torch.bfloat16):
        mine = input_of(rank, shape, dtype)
        dist.all_reduce(mine)
        want = sum(input_of(r, shape, dtype).float() for r in range(size))
        c.true(f"allreduce {dtype}", torch.allclose(mine.float(), want, rtol=2e-2, atol=0.5))
    # a non-contiguous tensor (a transposed view) is reduced in place
    base = input_of(rank, (6, 4), torch.float32)
    ref = base.clone()
    view = base.t()
    dist.all_reduce(view)
    dist.all_reduce(ref, group=gloo)
    c.same("allreduce of a transposed view", base, ref, False)

    root = size - 1
    # broadcast: every dtype, including bytes and booleans (which Gloo cannot: the root's input)
    for dtype in floats + ints + [torch.uint8, torch.int8, torch.float16, torch.bool]:
        mine, ref = input_of(rank, shape, dtype), input_of(rank, shape, dtype)
        dist.broadcast(mine, src=root)
        if dtype == torch.bool:
            ref = input_of(root, shape, dtype)
        else:
            dist.broadcast(ref, src=root, group=gloo)
        c.same(f"broadcast {dtype}", mine, ref, True)

    # outputs that are leaves requiring grad: written as NCCL writes them, outside autograd (Gloo
    # refuses the allgather: "a leaf Variable that requires grad is being used in an in-place operation")
    leaf = input_of(rank, (4, 6), torch.float32).t().requires_grad_()  # non-contiguous, too
    dist.broadcast(leaf, src=root)
    c.same("broadcast into a non-contiguous leaf that requires grad", leaf.detach(),
           input_of(root, (4, 6), torch.float32).t(), True)
    leaves = [torch.zeros(shape, requires_grad=True) for _ in range(size)]
    dist.all_gather(leaves, input_of(rank, shape, torch.float32))
    c.same("allgather into leaves that require grad", torch.stack([t.detach() for t in leaves]),
           torch.stack([input_of(r, shape, torch.float32) for r in range(size)]), True)

    # reduce to a root
    for dtype in (torch.float32, torch.int64):
        mine, ref = input_of(rank, shape, dtype), input_of(rank, shape, dtype)
        dist.reduce(mine, dst=0, op=R.MAX)
        dist.reduce(ref, dst=0, op=R.MAX, group=gloo)
        if rank == 0:
            c.same(f"reduce {dtype}", mine, ref, True)

    # allgather: list form and into one tensor
    for dtype in (torch.float32, torch.int32, torch.uint8):
        x = input_of(rank, shape, dtype)
        mine = [torch.empty(shape, dtype=dtype) for _ in range(size)]
        ref = [torch.empty(shape, dtype=dtype) for _ in range(size)]
        dist.all_gather(mine, x)
        dist.all_gather(ref, x, group=gloo)
        c.same(f"allgather {dtype}", torch.stack(mine), torch.stack(ref), True)
        flat = torch.empty((size * 5, 7), dtype=dtype)
        dist.all_gather_into_tensor(flat, x)  # Gloo has no such form: its list form, joined
        c.same(f"allgather into a tensor {dtype}", flat, torch.cat(ref), True)

    # gather and scatter at a root
    x = input_of(rank, shape, torch.float64)
    mine = [torch.empty(shape, dtype=torch.float64) for _ in range(size)] if rank == root else None
    ref = [torch.empty(shape, dtype=torch.float64) for _ in range(size)] if rank == root else None
    dist.gather(x, mine, dst=root)
    dist.gather(x, ref, dst=root, group=gloo)
    if rank == root:
        c.same("gather", torch.stack(mine), torch.stack(ref), True)
    pieces = [input_of(100 + r, shape, torch.int64) for r in range(size)] if rank == 0 else None
    mine, ref = torch.empty(shape, dtype=torch.int64), torch.empty(shape, dtype=torch.int64)
    dist.scatter(mine, pieces, src=0)
    dist.scatter(ref, [p.clone() for p in pieces] if pieces else None, src=0, group=gloo)
    c.same("scatter", mine, ref, True)

    # reduce_scatter (Gloo has none): Gloo's allreduce of the joined inputs, this rank's block
    for dtype in (torch.float32, torch.int64):
        xs = [input_of(rank * size + r, shape, dtype) for r in range(size)]
        mine = torch.empty(shape, dtype=dtype)
        dist.reduce_scatter(mine, xs)
        whole = torch.cat([t.flatten() for t in xs])
        dist.all_reduce(whole, group=gloo)
        want = whole.view(size, -1)[rank].view(shape)
        c.same(f"reduce_scatter {dtype}", mine, want, exact(dtype))
        mine = torch.empty(shape, dtype=dtype)
        dist.reduce_scatter_tensor(mine, torch.cat(xs))
        c.same(f"reduce_scatter from a tensor {dtype}", mine, want, exact(dtype))
    # uneven reduce_scatter: rank r's block holds r + 2 elements (Gloo's allreduce as above)
    offsets = [sum(r + 2 for r in range(q)) for q in range(size + 1)]
    for dtype in (torch.float64, torch.int32):
        xs = [input_of(rank * size + r, (r + 2,), dtype) for r in range(size)]
        mine = torch.empty(rank + 2, dtype=dtype)
        dist.reduce_scatter(mine, xs)
        whole = torch.cat(xs)
        dist.all_reduce(whole, group=gloo)
        c.same(f"uneven reduce_scatter {dtype}", mine, whole[offsets[rank]:offsets[rank + 1]], exact(dtype))

    coalesced(c, dist, torch, gloo, size, rank)
    fsdp_calls(c, dist, torch, gloo, size, rank)

    # alltoall: equal shares and uneven splits against Gloo's; the list form from known inputs
    x = input_of(rank, (size * 3, 2), torch.float32)
    mine, ref = torch.empty_like(x), torch.empty_like(x)
    dist.all_to_all_single(mine, x)
    dist.all_to_all_single(ref, x, group=gloo)
    c.same("alltoall, equal", mine, ref, True)
    # rank r sends (r + d) % 3 + 1 rows to rank d
    send = [(rank + d) % 3 + 1 for d in range(size)]
    recv = [(s + rank) % 3 + 1 for s in range(size)]
    x = input_of(rank, (sum(send), 3), torch.int32)
    mine, ref = torch.empty((sum(recv), 3), dtype=torch.int32), torch.empty((sum(recv), 3), dtype=torch.int32)
    dist.all_to_all_single(mine, x, recv, send)
    dist.all_to_all_single(ref, x, recv, send, group=gloo)
    c.same("alltoall, uneven splits", mine, ref, True)
    xs = [input_of(rank * 10 + d, (d + 1,), torch.int64) for d in range(size)]
    ys = [torch.empty((rank + 1,), dtype=torch.int64) for _ in range(size)]
    dist.all_to_all(ys, xs)
    want = [input_of(s * 10 + rank, (rank + 1,), torch.int64) for s in range(size)]
    c.same("alltoall, list of tensors", torch.cat(ys), torch.cat(want), True)

    # send and recv around a ring, asynchronous
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    out = input_of(rank, (33,), torch.float64)
    into = torch.empty(33, dtype=torch.float64)
    works = [dist.isend(out, nxt, tag=7), dist.irecv(into, prv, tag=7)]
    for w in works:
        w.wait()
    c.same("send/recv around a ring", into, input_of(prv, (33,), torch.float64), True)
    # batch_isend_irecv, as pipeline parallelism sends activations: both directions at once
    fwd, bwd = input_of(rank, (17,), torch.float32), input_of(rank + 50, (5,), torch.int64)
    from_prv, from_nxt = torch.empty(17), torch.empty(5, dtype=torch.int64)
    ops = [dist.P2POp(dist.isend, fwd, nxt), dist.P2POp(dist.irecv, from_prv, prv),
           dist.P2POp(dist.isend, bwd, prv), dist.P2POp(dist.irecv, from_nxt, nxt)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    c.same("batch_isend_irecv, forward", from_prv, input_of(prv, (17,), torch.float32), True)
    c.same("batch_isend_irecv, backward", from_nxt, input_of(nxt + 50, (5,), torch.int64), True)
    # a receive from any source names its sender
    if rank == 0:
        got = {}
        for _ in range(size - 1):
            t = torch.empty(2, dtype=torch.int64)
            sender = dist.recv(t, tag=11)
            got[sender] = t.tolist()
        c.true("recv from any source", got == {r: [r, r * r] for r in range(1, size)}, str(got))
    else:
        dist.send(torch.tensor([rank, rank * rank]), 0, tag=11)

    p2p_orderings(c, dist, torch, gloo, size, rank)

    # object collectives (pickles through uint8 allgather and broadcast), as scripts use for metrics
    objects = [None] * size
    dist.all_gather_object(objects, {"rank": rank, "name": "r" * (rank + 1)})
    c.true("all_gather_object", objects == [{"rank": r, "name": "r" * (r + 1)} for r in range(size)], str(objects))
    sent = [{"step": 7, "from": root}, list(range(rank + 3))] if rank == root else [None, None]
    dist.broadcast_object_list(sent, src=root)
    c.true("broadcast_object_list", sent == [{"step": 7, "from": root}, list(range(root + 3))], str(sent))

    # asynchronous work: wait with a timeout, and the future DDP's hooks use
    x = input_of(rank, shape, torch.float32)
    ref = x.clone()
    work = dist.all_reduce(x, async_op=True)
    c.true("async allreduce wait", work.wait(timeout=timedelta(seconds=30)))
    dist.all_reduce(ref, group=gloo)
    c.same("async allreduce result", x, ref, False)
    y = input_of(rank, shape, torch.float32)
    fut = dist.all_reduce(y, async_op=True).get_future()
    c.same("async allreduce future", fut.wait()[0], ref, False)

    # forming a group waits for the last rank to come; other Python threads run meanwhile
    ticks, done = [0], threading.Event()

    def ticker():
        while not done.is_set():
            ticks[0] += 1
            time.sleep(0.01)

    if rank == 0:
        threading.Thread(target=ticker, daemon=True).start()
    if rank == size - 1:
        time.sleep(1.0)
    late = dist.new_group(list(range(size)), backend="dtrain")
    done.set()
    if rank == 0:
        c.true("Python threads run while a group forms", ticks[0] > 30, f"({ticks[0]} ticks of 10 ms in 1 s)")
    dist.destroy_process_group(late)
    del late

    # a sub-group: the first and last ranks
    members = [0, size - 1]
    sub = dist.new_group(members, backend="dtrain")
    sub_gloo = dist.new_group(members, backend="gloo")
    if rank in members:
        mine, ref = input_of(rank, shape, torch.int64), input_of(rank, shape, torch.int64)
        dist.all_reduce(mine, group=sub)
        dist.all_reduce(ref, group=sub_gloo)
        c.same("allreduce in a sub-group", mine, ref, True)

    dist.barrier()
    c.true("barrier", True)

    # a receive nobody sends to: wait(timeout) raises in time; then the message comes
    if rank == 0:
        late = torch.empty(4)
        work = dist.irecv(late, src=1, tag=99)
        t0 = time.monotonic()
        try:
            work.wait(timeout=timedelta(milliseconds=300))
            c.true("wait with a timeout raises", False, "(returned)")
        except RuntimeError as e:
            took = time.monotonic() - t0
            c.true("wait with a timeout raises in time", took < 2.0, f"({took:.2f} s: {e})")
        dist.barrier(group=gloo)
        work.wait()
        c.same("the late message", late, torch.arange(4.0), True)
    else:
        dist.barrier(group=gloo)
        if rank == 1:
            dist.send(torch.arange(4.0), 0, tag=99)

    # destroying a group ends a receive that waits on it at once, not at its 60 s deadline (rank
    # 0 destroys it first: the others' goodbyes would end the receive too)
    lonely = dist.new_group(list(range(size)), backend="dtrain", timeout=timedelta(seconds=60))
    if rank == 0:
        work = dist.irecv(torch.empty(2), src=1, tag=5, group=lonely)
        time.sleep(0.2)  # the receive is posted and waiting
        t0 = time.monotonic()
        dist.destroy_process_group(lonely)
        del lonely
        took = time.monotonic() - t0
        c.true("destroying a group ends its waiting receive", took < 5.0, f"({took:.2f} s)")
        try:
            work.wait()
            c.true("the ended receive raises", False, "(returned)")
        except RuntimeError as e:
            c.true("the ended receive raises, saying it was cancelled", "cancel" in str(e), str(e))
    dist.barrier(group=gloo)
    if rank != 0:
        dist.destroy_process_group(lonely)
        del lonely

    # a collective one rank never joins: the others' deadline names what they waited for
    short = dist.new_group(list(range(size)), backend="dtrain", timeout=timedelta(seconds=1))
    if rank != size - 1:
        t0 = time.monotonic()
        try:
            dist.all_reduce(torch.ones(8), group=short)
            c.true("a collective past its deadline raises", False, "(returned)")
        except RuntimeError as e:
            took = time.monotonic() - t0
            c.true("a collective past its deadline raises, naming the operation", took < 5.0 and "allreduce" in str(e),
                   f"({took:.2f} s: {e})")
    dist.barrier(group=gloo)

    # a timeout set on a group after it was made (ProcessGroup.set_timeout, torch 2.9 on) holds
    # for its receives and its collectives alike
    later = dist.new_group(list(range(size)), backend="dtrain", timeout=timedelta(seconds=60))
    if hasattr(later, "set_timeout"):
        later.set_timeout(timedelta(seconds=1))
        for what, call in (("a receive", lambda: dist.recv(torch.empty(2), src=1, tag=7, group=later)),
                           ("a collective", lambda: dist.all_reduce(torch.ones(8), group=later))):
            if rank == 0:
                t0 = time.monotonic()
                try:
                    call()
                    c.true(f"{what} past the timeout set later raises", False, "(returned)")
                except RuntimeError as e:
                    took = time.monotonic() - t0
                    said_once = str(e).count("deadline exceeded") == 1
                    c.true(f"{what} past the timeout set later raises at it, saying why once", 0.9 < took < 5.0 and said_once,
                           f"({took:.2f} s: {e})")
            dist.barrier(group=gloo)

    # bad input: a clear error, raised at the call
    try:
        dist.all_reduce(torch.ones(3, dtype=torch.int16))
        c.true("int16 tensors are refused", False)
    except RuntimeError as e:
        c.true("int16 tensors are refused, naming the dtype", "Short" in str(e), str(e))


def coalesced(c, dist, torch, gloo, size, rank):
    """The coalesced calls, one collective for several tensors of different shapes."""
    def flat(ts):
        return torch.cat([t.flatten() for t in ts])

    shapes = [(3,), (2, 5), (4, 1)]
    xs = [input_of(rank * 3 + i, s, torch.float32) for i, s in enumerate(shapes)]
    mine, ref = [x.clone() for x in xs], [x.clone() for x in xs]
    dist.all_reduce_coalesced(mine)
    dist.all_reduce_coalesced(ref, group=gloo)
    c.same("allreduce_coalesced", flat(mine), flat(ref), False)
    mine = [[torch.empty(s) for s in shapes] for _ in range(size)]  # [rank][input]
    ref = [[torch.empty(s) for s in shapes] for _ in range(size)]
    dist.all_gather_coalesced(mine, xs)
    dist.all_gather_coalesced(ref, xs, group=gloo)
    c.same("allgather_coalesced", flat(t for ts in mine for t in ts), flat(t for ts in ref for t in ts), True)
    if int(torch.__version__.split(".")[0]) < 2:
        return
    # torch 2's fast path, as FSDP and DTensor use it: into-tensor calls under a coalescing
    # manager become one allgather_into_tensor_coalesced / reduce_scatter_tensor_coalesced
    ints = [input_of(rank * 3 + i, s, torch.int64) for i, s in enumerate(shapes)]
    gathered = [torch.empty((size * s[0],) + s[1:], dtype=torch.int64) for s in shapes]
    with dist._coalescing_manager(async_ops=True) as cm:
        for y, x in zip(gathered, ints):
            dist.all_gather_into_tensor(y, x)
    cm.wait()
    want = [torch.cat([input_of(r * 3 + i, s, torch.int64) for r in range(size)]) for i, s in enumerate(shapes)]
    c.same("allgather into tensors, coalesced", flat(gathered), flat(want), True)
    wholes = [input_of(rank * 3 + i, (size * s[0],) + s[1:], torch.int64) for i, s in enumerate(shapes)]
    scattered = [torch.empty(s, dtype=torch.int64) for s in shapes]
    with dist._coalescing_manager(async_ops=True) as cm:
        for y, x in zip(scattered, wholes):
            dist.reduce_scatter_tensor(y, x)
    cm.wait()
    for i, (y, x) in enumerate(zip(scattered, wholes)):
        total = x.clone()
        dist.all_reduce(total, group=gloo)
        c.same(f"reduce_scatter from tensors, coalesced, #{i}", y, total.view(size, -1)[rank].view(y.shape), True)


def fsdp_calls(c, dist, torch, gloo, size, rank):
    """The calls FSDP makes, on any torch. fully_shard (torch 2) copies every parameter's shard into
    one flat buffer and gathers it with one async all_gather_into_tensor, and reduce-scatters the
    gradients, chunk-catted into one buffer, with one reduce_scatter_tensor (SUM); 1.13's
    FullyShardedDataParallel makes the same calls as _all_gather_base and _reduce_scatter_base.
    All reach ProcessGroup._allgather_base / _reduce_scatter_base, called here directly too.
    Gloo has neither: the reference is its list allgather and its allreduce."""
    from torch._C._distributed_c10d import AllgatherOptions, ReduceScatterOptions
    pg = dist.distributed_c10d._get_default_group()
    numels = (6, 10, 3)  # uneven parameter shards
    shard = torch.cat([input_of(rank * 4 + i, (n,), torch.float32) for i, n in enumerate(numels)])
    want = [torch.empty_like(shard) for _ in range(size)]
    dist.all_gather(want, shard, group=gloo)
    for how, gather in (("all_gather_into_tensor", lambda y: dist.all_gather_into_tensor(y, shard, async_op=True)),
                        ("ProcessGroup._allgather_base", lambda y: pg._allgather_base(y, shard, AllgatherOptions()))):
        y = torch.empty(size * shard.numel())
        gather(y).wait()
        c.same(f"FSDP's parameter allgather, {how}", y, torch.cat(want), True)
    grads = input_of(rank + 70, (size * sum(numels),), torch.float32)
    total = grads.clone()
    dist.all_reduce(total, group=gloo)
    opts = ReduceScatterOptions()
    opts.reduceOp = dist.ReduceOp.SUM
    for how, scatter in (("reduce_scatter_tensor", lambda y: dist.reduce_scatter_tensor(y, grads, async_op=True)),
                         ("ProcessGroup._reduce_scatter_base", lambda y: pg._reduce_scatter_base(y, grads, opts))):
        y = torch.empty(sum(numels))
        scatter(y).wait()
        c.same(f"FSDP's gradient reduce-scatter, {how}", y, total.view(size, -1)[rank], False)


def killed(c, dist, torch, size, rank):
    """The last rank dies (SIGKILL) mid-allreduce; the others must raise within a second, naming it."""
    store = dist.distributed_c10d._get_default_store()
    victim = size - 1
    x = torch.ones(1 << 22)  # 16 MiB: each allreduce takes a while
    for i in range(1000):
        if rank == victim and i == 5:
            store.set("killed_at", repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            dist.all_reduce(x)
        except RuntimeError as e:
            now = time.time()
            at = float(store.get("killed_at").decode())
            took = now - at
            print(f"rank {rank}: allreduce #{i} raised {took * 1000:.0f} ms after the kill: {e}", flush=True)
            c.true("the survivors raise within a second", took < 1.0, f"({took:.2f} s)")
            c.true("the error names the lost rank", f"rank {victim}" in str(e), str(e))
            if hasattr(dist, "DistBackendError"):  # torch 2: the type its own backends raise
                c.true("the error is a DistBackendError", isinstance(e, dist.DistBackendError), type(e).__name__)
            break
    else:
        c.true("an allreduce raised", False)
    # Rank 0 serves the store: it stays until every survivor has read from it.
    store.add("survivors_done", 1)
    deadline = time.monotonic() + 30
    while rank == 0 and store.add("survivors_done", 0) < size - 1 and time.monotonic() < deadline:
        time.sleep(0.01)


def exit_without_destroy(c, dist, torch, size, rank):
    """Many scripts never call destroy_process_group: the group ends as the interpreter does, with
    a collective still in flight. The launcher wants every rank to exit 0 within its deadline."""
    x = torch.ones(1000)
    dist.all_reduce(x)
    c.same("an allreduce before exit", x, torch.full((1000,), float(size)), True)
    dist.all_reduce(torch.ones(10), async_op=True)  # never waited for
    print(f"rank {rank}: {'PASS' if not c.failed else 'FAIL'} ({c.passed} checks passed); exiting", flush=True)


def p2p_orderings(c, dist, torch, gloo, size, rank):
    """Sends and receives in every order a program posts them, on dtrain and on Gloo: the same
    results, and dtrain finishes each at once (a receive that held back later sends would wait
    for the group's 30 s deadline)."""
    import threading
    import time
    nxt, prv = (rank + 1) % size, (rank - 1) % size

    def ring_receive_first(group):
        into = torch.empty(40, dtype=torch.float64)
        r = dist.irecv(into, prv, group=group, tag=21)
        time.sleep(0.05)  # the receive is posted, and waiting, before the send is called
        s = dist.isend(input_of(rank + 200, (40,), torch.float64), nxt, group=group, tag=21)
        r.wait()
        s.wait()
        return [into]

    def batched_receive_first(group):
        into = torch.empty(9, dtype=torch.float32)
        ops = [dist.P2POp(dist.irecv, into, prv, group, 22),
               dist.P2POp(dist.isend, input_of(rank + 300, (9,), torch.float32), nxt, group, 22)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        return [into]

    def swap_receive_first(group):  # ranks 0-1, 2-3, ...; an odd one out swaps with itself by copy
        peer = rank ^ 1
        mine = input_of(rank + 400, (1000,), torch.int64)
        if peer >= size:
            return [mine.clone()]
        into = torch.empty(1000, dtype=torch.int64)
        r = dist.irecv(into, peer, group=group, tag=23)
        time.sleep(0.05)
        s = dist.isend(mine, peer, group=group, tag=23)
        s.wait()  # the send waited first: it must not need the receive to finish
        r.wait()
        return [into]

    def many_in_flight(group):  # 12 receives from prv, then 12 sends to nxt, waited newest first
        intos = [torch.empty(k + 1, dtype=torch.float64) for k in range(12)]
        works = [dist.irecv(t, prv, group=group, tag=24) for t in intos]
        time.sleep(0.05)
        works += [dist.isend(input_of(rank * 100 + k, (k + 1,), torch.float64), nxt, group=group, tag=24)
                  for k in range(12)]
        for w in reversed(works):
            w.wait()
        return intos

    def out_of_order(group):  # rank 1 sends B, then A only once rank 0 has B: B's work must not wait for A's
        if rank > 1:
            dist.barrier(group=gloo)
            return []
        a, b = torch.empty(3), torch.empty(3)
        if rank == 0:
            ra = dist.irecv(a, 1, group=group, tag=25)
            rb = dist.irecv(b, 1, group=group, tag=26)
            rb.wait()
            dist.barrier(group=gloo)
            ra.wait()
            return [a, b]
        dist.isend(input_of(500, (3,), torch.float32), 0, group=group, tag=26).wait()
        dist.barrier(group=gloo)
        dist.isend(input_of(501, (3,), torch.float32), 0, group=group, tag=25).wait()
        return []

    def beside_collectives(group):  # a ring receive-first while another thread runs allreduces
        sums = []

        def reduce():
            for k in range(20):
                t = torch.full((64,), float(rank + k))
                dist.all_reduce(t, group=group)
                sums.append(t[0].item())
        other = threading.Thread(target=reduce)
        other.start()
        got = ring_receive_first(group)
        other.join()
        want = [float(size * (size - 1) // 2 + size * k) for k in range(20)]
        return got + [torch.tensor(sums if sums == want else [-1.0])]

    wanted = {
        "ring, receive first": lambda: [input_of(prv + 200, (40,), torch.float64)],
        "batch_isend_irecv, receive first": lambda: [input_of(prv + 300, (9,), torch.float32)],
        "two-rank swap, receive first": lambda: [input_of((rank ^ 1 if rank ^ 1 < size else rank) + 400, (1000,),
                                                          torch.int64)],
        "12 in flight, waited newest first": lambda: [input_of(prv * 100 + k, (k + 1,), torch.float64)
                                                      for k in range(12)],
        "a later receive completing first": lambda: [input_of(501, (3,), torch.float32),
                                                     input_of(500, (3,), torch.float32)] if rank == 0 else [],
        "beside allreduces on another thread": lambda: [input_of(prv + 200, (40,), torch.float64),
                                                        torch.tensor([float(size * (size - 1) // 2 + size * k)
                                                                      for k in range(20)])],
    }
    for name, run in (("ring, receive first", ring_receive_first),
                      ("batch_isend_irecv, receive first", batched_receive_first),
                      ("two-rank swap, receive first", swap_receive_first),
                      ("12 in flight, waited newest first", many_in_flight),
                      ("a later receive completing first", out_of_order),
                      ("beside allreduces on another thread", beside_collectives)):
        for backend, group in (("dtrain", None), ("gloo", gloo)):
            begun = time.monotonic()
            got = run(group)
            took = time.monotonic() - begun
            want = wanted[name]()
            c.true(f"p2p {name} on {backend}: as many tensors", len(got) == len(want))
            for k, (g, w) in enumerate(zip(got, want)):
                c.same(f"p2p {name} on {backend} [{k}]", g, w, True)
            if backend == "dtrain":
                c.true(f"p2p {name} on dtrain finishes at once", took < 5.0, f"took {took:.1f} s")
        dist.barrier(group=gloo)


def rank_main(args):
    if args.module_dir:
        sys.path.insert(0, args.module_dir)
    import torch
    import torch.distributed as dist
    import dtrain_torch  # noqa: F401  (registers the backend)

    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.init == "tcp":
        where = f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
        dist.init_process_group("dtrain", init_method=where, rank=rank, world_size=size, timeout=timedelta(seconds=30))
    else:  # env://, as torchrun and this launcher set it
        dist.init_process_group("dtrain", init_method="env://", timeout=timedelta(seconds=30))
    c = Checker(rank)
    if args.exit_without_destroy:
        exit_without_destroy(c, dist, torch, size, rank)
        return 0 if not c.failed else 1  # the interpreter's exit must end the group, and soon
    if args.kill:
        killed(c, dist, torch, size, rank)
        print(f"rank {rank}: {'PASS' if not c.failed else 'FAIL'} ({c.passed} checks passed, {len(c.failed)} failed)",
              flush=True)
        os._exit(0 if not c.failed else 1)  # the group is broken: no orderly goodbye to wait for
    gloo = dist.new_group(list(range(size)), backend="gloo")
    collectives(c, dist, torch, gloo, size, rank)
    return finish(c, dist, gloo, rank)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=3)
    p.add_argument("--kill", action="store_true", help="kill the last rank mid-allreduce")
    p.add_argument("--exit-without-destroy", action="store_true",
                   help="exit with the group alive and a collective in flight (no destroy_process_group)")
    p.add_argument("--module-dir", help="where dtrain_torch's module was built")
    p.add_argument("--init", choices=["env", "tcp"], default="env", help="init_method: env:// or tcp://host:port")
    p.add_argument("--launcher", choices=["self", "torchrun"], default="self", help="who starts the ranks")
    args = p.parse_args()
    if "RANK" not in os.environ:
        return launch(args)
    return rank_main(args)


if __name__ == "__main__":
    sys.exit(main())

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
import sys
import threading
import time
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the harness beside this file
from against_gloo import Checker, finish, input_of, launch  # noqa: E402
from c10d_calls import coalesced, exit_without_destroy, fsdp_calls, killed, p2p_orderings  # noqa: E402


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
    bitwise = (("BAND", R.BAND, torch.bitwise_and), ("BOR", R.BOR, torch.bitwise_or),
               ("BXOR", R.BXOR, torch.bitwise_xor))
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

    # a message of another size than its tensor, larger or smaller, with the receive posted before
    # the message arrives and after: an error naming both sizes, a larger message leaves the tensor
    # as it was, and the next message, of the right size, still lands
    cases = [(5, True), (5, False), (3, True), (3, False)]
    for sent, posted_first in cases:
        if rank == 0:
            into = torch.full((4,), -1.0)
            if posted_first:
                work = dist.irecv(into, src=1, tag=98)
                dist.barrier(group=gloo)  # rank 1 sends after this
            else:
                dist.barrier(group=gloo)  # rank 1 has sent
                time.sleep(0.1)  # and the message is here before the receive
                work = dist.irecv(into, src=1, tag=98)
            order = "posted first" if posted_first else "arrived first"
            try:
                work.wait()
                c.true(f"{sent} floats into a tensor of 4, {order}, raises", False, "(returned)")
            except RuntimeError as e:
                c.true(f"{sent} floats into a tensor of 4, {order}, raises, naming both sizes",
                       f"{4 * sent} bytes arrived for a tensor of 16" in str(e), str(e))
            if sent > 4:
                c.same(f"{sent} floats into a tensor of 4, {order}: the tensor is untouched", into,
                       torch.full((4,), -1.0), True)
        elif rank == 1:
            if posted_first:
                dist.barrier(group=gloo)
                dist.send(torch.ones(sent), 0, tag=98)
            else:
                dist.send(torch.ones(sent), 0, tag=98)
                dist.barrier(group=gloo)
        else:
            dist.barrier(group=gloo)
    if rank == 0:
        right = torch.empty(4)
        dist.recv(right, src=1, tag=98)
        c.same("the message after four of the wrong size", right, torch.arange(4.0) + 1, True)
    elif rank == 1:
        dist.send(torch.arange(4.0) + 1, 0, tag=98)

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
                    c.true(f"{what} past the timeout set later raises at it, saying why once",
                           0.9 < took < 5.0 and said_once, f"({took:.2f} s: {e})")
            dist.barrier(group=gloo)

    # bad input: a clear error, raised at the call
    try:
        dist.all_reduce(torch.ones(3, dtype=torch.int16))
        c.true("int16 tensors are refused", False)
    except RuntimeError as e:
        c.true("int16 tensors are refused, naming the dtype", "Short" in str(e), str(e))




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

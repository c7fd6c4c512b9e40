#!/usr/bin/env python3
"""CUDA tensors through dtrain's torch.distributed backend, staged through the host.

    python3 cuda_staging.py --ranks 2 [--module-dir DIR]

Needs a CUDA device (every rank may share one); without one it says so and exits 77, which CTest
reports as skipped. Each rank checks:
  - every collective, send/recv and the coalesced calls on CUDA tensors against the same call over
    a Gloo group of the same ranks on CPU copies of the same inputs (where Gloo lacks the call, a
    reference composed from Gloo's calls): exact for integers, within float tolerance otherwise;
  - stream order: a call sees kernels queued on the current stream before it, and after wait() or
    the future's wait() the current stream sees the results, with no device synchronisation;
  - DDP on a CUDA model over dtrain and over Gloo: the same parameters after some steps;
  - a call mixing CPU and CUDA tensors is refused, naming both devices.
The launcher passes only if every rank reports every check passed. With --device cpu the same
checks run where there is no GPU, the "GPU" tensors on the CPU: dtrain's CPU path against Gloo.
"""
import argparse
import os
import sys
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from against_gloo import Checker, finish, input_of, launch  # noqa: E402

SKIPPED = 77


def mapped(tree, f):
    """`tree` (a tensor, None, or a list of them, nested) with f applied to each tensor."""
    if isinstance(tree, list):
        return [mapped(t, f) for t in tree]
    return None if tree is None else f(tree)


def leaves(tree):
    if isinstance(tree, list):
        return [leaf for t in tree for leaf in leaves(t)]
    return [] if tree is None else [tree]


def calls_on_gpu(c, dist, torch, gloo, size, rank, dev):
    """Each call over dtrain on `dev`'s tensors against the same call over Gloo on CPU copies of the
    same inputs: every tensor afterwards. Where Gloo lacks the call, `ref` composes it from Gloo's."""
    def agree(got, want, sums):
        if not sums or not want.is_floating_point():  # moved or compared, not summed: the same bits
            return torch.equal(got, want)
        tol = 1e-2 if want.element_size() == 2 else 1e-5  # the backends may sum in other orders
        return torch.allclose(got.double(), want.double(), rtol=tol, atol=tol)

    def same(name, call, tensors, ref=None, here=True, sums=False):
        want, mine = mapped(tensors, lambda t: t.clone()), mapped(tensors, lambda t: t.to(dev, copy=True))
        (ref or call)(want, gloo)
        call(mine, None)  # None: the default group, dtrain
        if not here:  # c10d leaves this rank's tensors unspecified (a reduce's non-root)
            return
        got, want = leaves(mine), leaves(want)
        c.true(name, all(g.device.type == dev.type for g in got) and
               all(agree(g.cpu(), w, sums) for g, w in zip(got, want)), "(differs from Gloo's)")

    R = dist.ReduceOp

    def reduced(op):  # Gloo has no AVG and no bfloat16: its float64 sum, divided and rounded
        def ref(ts, g):
            wide = ts[0].double()
            dist.all_reduce(wide, op=R.SUM if op == R.AVG else op, group=g)
            ts[0].copy_(wide / size if op == R.AVG else wide)
        return ref

    def scattered(ts, g):  # Gloo has no reduce_scatter: its allreduce of the joined inputs, this rank's block
        out, ins = ts[0], ts[1] if isinstance(ts[1], list) else list(ts[1].chunk(size))
        whole = torch.cat([t.flatten() for t in ins])
        dist.all_reduce(whole, group=g)
        at = sum(t.numel() for t in ins[:rank])
        out.copy_(whole[at:at + out.numel()].view_as(out))

    def exchanged(ts, g):  # Gloo has no list alltoall: its alltoall_single with the lists' sizes as splits
        send, recv = [t.shape[0] for t in ts[0]], [t.shape[0] for t in ts[1]]
        out = torch.empty((sum(recv),) + ts[1][0].shape[1:], dtype=ts[1][0].dtype)
        dist.all_to_all_single(out, torch.cat(ts[0]), recv, send, group=g)
        for t, piece in zip(ts[1], out.split(recv)):
            t.copy_(piece)

    def gathered_into(ts, g):  # Gloo's list allgather into the output's blocks
        ys, xs = (ts[1], ts[0]) if isinstance(ts[0], list) else ([ts[1]], [ts[0]])
        for y, x in zip(ys, xs):
            dist.all_gather(list(y.chunk(size)), x, group=g)

    shape = (5, 7)
    root = size - 1
    for dtype, op in ((torch.float32, R.SUM), (torch.int64, R.MAX), (torch.float64, R.AVG), (torch.float16, R.SUM),
                      (torch.bfloat16, R.SUM), (torch.int32, R.BXOR)):
        same(f"allreduce {dtype} {op}", lambda ts, g: dist.all_reduce(ts[0], op=op, group=g),
             [input_of(rank, shape, dtype)], reduced(op) if op == R.AVG or dtype == torch.bfloat16 else None, sums=True)
    same("allreduce of a transposed view", lambda ts, g: dist.all_reduce(ts[0].t(), group=g),
         [input_of(rank, (6, 4), torch.float32)], sums=True)
    for dtype in (torch.float64, torch.uint8, torch.bool):  # Gloo has no bool: the same bytes as uint8
        same(f"broadcast {dtype}", lambda ts, g: dist.broadcast(ts[0], src=root, group=g),
             [input_of(rank, shape, dtype)], lambda ts, g: dist.broadcast(ts[0].view(torch.uint8), src=root, group=g))
    same("reduce", lambda ts, g: dist.reduce(ts[0], dst=0, op=R.MIN, group=g), [input_of(rank, shape, torch.float32)],
         here=rank == 0)
    x = input_of(rank, shape, torch.int32)
    same("allgather", lambda ts, g: dist.all_gather(ts[1], ts[0], group=g),
         [x, [torch.empty(shape, dtype=torch.int32) for _ in range(size)]])
    same("allgather into a tensor", lambda ts, g: dist.all_gather_into_tensor(ts[1], ts[0], group=g),
         [x, torch.empty((size * 5, 7), dtype=torch.int32)], gathered_into)
    outputs = [torch.empty(shape, dtype=torch.int32) for _ in range(size)] if rank == root else None
    same("gather", lambda ts, g: dist.gather(ts[0], ts[1], dst=root, group=g), [x, outputs])
    pieces = [input_of(100 + r, shape, torch.int64) for r in range(size)] if rank == 0 else None
    same("scatter", lambda ts, g: dist.scatter(ts[0], ts[1], src=0, group=g),
         [torch.empty(shape, dtype=torch.int64), pieces])
    xs = [input_of(rank * size + r, shape, torch.float32) for r in range(size)]
    same("reduce_scatter", lambda ts, g: dist.reduce_scatter(ts[0], ts[1], group=g), [torch.empty(shape), xs],
         scattered, sums=True)
    same("reduce_scatter from a tensor", lambda ts, g: dist.reduce_scatter_tensor(ts[0], ts[1], group=g),
         [torch.empty(shape), torch.cat(xs)], scattered, sums=True)
    same("reduce_scatter, uneven", lambda ts, g: dist.reduce_scatter(ts[0], ts[1], group=g),
         [torch.empty(rank + 2), [input_of(rank * size + r, (r + 2,), torch.float32) for r in range(size)]], scattered,
         sums=True)
    same("alltoall, equal", lambda ts, g: dist.all_to_all_single(ts[1], ts[0], group=g),
         [input_of(rank, (size * 3, 2), torch.float32), torch.empty((size * 3, 2))])
    send = [(rank + d) % 3 + 1 for d in range(size)]
    recv = [(s + rank) % 3 + 1 for s in range(size)]
    same("alltoall, uneven splits", lambda ts, g: dist.all_to_all_single(ts[1], ts[0], recv, send, group=g),
         [input_of(rank, (sum(send), 3), torch.int32), torch.empty((sum(recv), 3), dtype=torch.int32)])
    same("alltoall, list of tensors", lambda ts, g: dist.all_to_all(ts[1], ts[0], group=g),
         [[input_of(rank * 10 + d, (d + 1,), torch.int64) for d in range(size)],
          [torch.empty((rank + 1,), dtype=torch.int64) for _ in range(size)]], exchanged)
    shapes = [(3,), (2, 5), (4, 1)]
    parts = [input_of(rank * 3 + i, s, torch.float32) for i, s in enumerate(shapes)]
    same("allreduce_coalesced", lambda ts, g: dist.all_reduce_coalesced(ts, group=g), parts, sums=True)
    if hasattr(dist, "_coalescing_manager") and int(torch.__version__.split(".")[0]) >= 2:
        def gathered(ts, g):
            with dist._coalescing_manager(group=g, async_ops=True) as cm:
                for y, x in zip(ts[1], ts[0]):
                    dist.all_gather_into_tensor(y, x, group=g)
            cm.wait()
        same("allgather into tensors, coalesced", gathered,
             [parts, [torch.empty((size * s[0],) + s[1:]) for s in shapes]], gathered_into)

    nxt, prv = (rank + 1) % size, (rank - 1) % size

    def ring(ts, g):
        for w in (dist.isend(ts[0], nxt, group=g, tag=3), dist.irecv(ts[1], prv, group=g, tag=3)):
            w.wait()
    same("send/recv around a ring", ring, [input_of(rank, (33,), torch.float64), torch.empty(33, dtype=torch.float64)])


def stream_order(c, dist, torch, size, rank, dev):
    """No torch.cuda.synchronize() here: the backend itself must order the copies."""
    total = float(sum(range(1, size + 1)))
    # The input is written by a kernel queued behind ~50 ms of GPU work on the current stream.
    x = torch.zeros(1 << 20, device=dev)
    torch.cuda._sleep(100_000_000)
    x.fill_(rank + 1)
    dist.all_reduce(x)
    c.true("a call sees the kernels queued before it", bool(torch.all(x == total)), f"({x[:4].tolist()})")
    # 64 MiB: the copy back takes milliseconds, so a kernel that did not wait for it would read
    # the old values.
    for how in ("wait", "future"):
        big = torch.full((1 << 24,), float(rank + 1), device=dev)
        work = dist.all_reduce(big, async_op=True)
        if how == "wait":
            work.wait()
        else:
            work.get_future().wait()
        smallest, largest = big.min().item(), big.max().item()
        c.true(f"after {how}(), the current stream sees the result", smallest == largest == total,
               f"(min {smallest}, max {largest}, want {total})")
    # A callback chained on the future, as DDP's communication hooks chain one.
    y = torch.full((1000,), float(rank + 1), device=dev)
    doubled = dist.all_reduce(y, async_op=True).get_future().then(lambda f: f.value()[0] * 2).wait()
    c.true("a callback on the future sees the result", doubled.is_cuda and bool(torch.all(doubled == 2 * total)))


def ddp_on_gpu(c, dist, torch, gloo, rank, dev):
    """The same model trained by DDP over dtrain and over Gloo, on CUDA: the same parameters."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    def trained(group):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)).to(dev)
        ddp = DDP(model, device_ids=[dev.index] if dev.type == "cuda" else None, process_group=group,
                  bucket_cap_mb=0.01)  # several buckets
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(rank)
        for _ in range(5):
            data, labels = torch.randn(16, 32, generator=g).to(dev), torch.randint(0, 10, (16,), generator=g).to(dev)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(ddp(data), labels).backward()
            opt.step()
        return torch.cat([p.detach().flatten() for p in model.parameters()]).cpu()

    mine, ref = trained(None), trained(gloo)
    c.true("DDP on CUDA over dtrain matches Gloo", torch.allclose(mine, ref, rtol=1e-5, atol=1e-6),
           f"(largest difference {(mine - ref).abs().max().item()})")


def refusals(c, dist, torch, size, dev):
    try:
        dist.all_gather([torch.empty(2) for _ in range(size)], torch.ones(2, device=dev))
        c.true("a call mixing CPU and CUDA tensors is refused", False, "(returned)")
    except (RuntimeError, ValueError) as e:
        c.true("a call mixing CPU and CUDA tensors is refused, naming the devices",
               "cuda" in str(e) and "cpu" in str(e), str(e))


def rank_main(args):
    if args.module_dir:
        sys.path.insert(0, args.module_dir)
    import torch
    import torch.distributed as dist
    import dtrain_torch  # noqa: F401  (registers the backend)

    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.device == "cuda":
        dev = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(dev)
    else:  # the harness checking itself on a machine without a GPU
        dev = torch.device("cpu")
    dist.init_process_group("dtrain", init_method="env://", timeout=timedelta(seconds=60))
    gloo = dist.new_group(list(range(size)), backend="gloo")
    c = Checker(rank)
    calls_on_gpu(c, dist, torch, gloo, size, rank, dev)
    ddp_on_gpu(c, dist, torch, gloo, rank, dev)
    if dev.type == "cuda":
        stream_order(c, dist, torch, size, rank, dev)
        refusals(c, dist, torch, size, dev)
    return finish(c, dist, gloo, rank)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--module-dir", help="where dtrain_torch's module was built")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="cpu: the harness checks itself, the 'GPU' tensors on the CPU (no stream checks)")
    args = p.parse_args()
    if "RANK" in os.environ:
        return rank_main(args)
    import torch
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"no CUDA device (torch {torch.__version__}, CUDA build: {torch.version.cuda}): skipped")
        return SKIPPED
    return launch(args)


if __name__ == "__main__":
    sys.exit(main())

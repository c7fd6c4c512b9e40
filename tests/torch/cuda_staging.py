#!/usr/bin/env python3
"""CUDA tensors through dtrain's torch.distributed backend, staged through the host.

    python3 cuda_staging.py --ranks 2 [--module-dir DIR]

Needs a CUDA device (every rank may share one); without one it says so and exits 77, which CTest
reports as skipped. Each rank checks:
  - every collective, send/recv and the coalesced calls on CUDA tensors against the same call on
    CPU copies of the same inputs, bit for bit (both run dtrain's host algorithm; the CPU path is
    checked against Gloo by c10d_against_gloo.py);
  - stream order: a call sees kernels queued on the current stream before it, and after wait() or
    the future's wait() the current stream sees the results, with no device synchronisation;
  - DDP on a CUDA model over dtrain and over Gloo: the same parameters after some steps;
  - a call mixing CPU and CUDA tensors is refused, naming both devices.
The launcher passes only if every rank reports every check passed. With --device cpu the harness
checks itself where there is no GPU: the same calls and DDP, the "GPU" tensors on the CPU.
"""
import argparse
import os
import sys
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from c10d_against_gloo import Checker, finish, input_of, launch  # noqa: E402

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


def calls_on_gpu(c, dist, torch, size, rank, dev):
    """Each call on CUDA tensors against the same call on CPU copies: every tensor afterwards."""
    def same(name, call, tensors):
        on_cpu, on_gpu = mapped(tensors, lambda t: t.clone()), mapped(tensors, lambda t: t.to(dev))
        call(on_cpu)
        call(on_gpu)
        got, want = leaves(on_gpu), leaves(on_cpu)
        c.true(name, all(g.device.type == dev.type for g in got) and
               all(torch.equal(g.cpu(), w) for g, w in zip(got, want)), "(differs from the CPU call)")

    R = dist.ReduceOp
    shape = (5, 7)
    root = size - 1
    for dtype, op in ((torch.float32, R.SUM), (torch.int64, R.MAX), (torch.float64, R.AVG), (torch.float16, R.SUM),
                      (torch.bfloat16, R.SUM), (torch.int32, R.BXOR)):
        same(f"allreduce {dtype} {op}", lambda ts: dist.all_reduce(ts[0], op=op), [input_of(rank, shape, dtype)])
    same("allreduce of a transposed view", lambda ts: dist.all_reduce(ts[0].t()), [input_of(rank, (6, 4), torch.float32)])
    for dtype in (torch.float64, torch.uint8, torch.bool):
        same(f"broadcast {dtype}", lambda ts: dist.broadcast(ts[0], src=root), [input_of(rank, shape, dtype)])
    same("reduce", lambda ts: dist.reduce(ts[0], dst=0, op=R.MIN), [input_of(rank, shape, torch.float32)])
    x = input_of(rank, shape, torch.int32)
    same("allgather", lambda ts: dist.all_gather(ts[1], ts[0]),
         [x, [torch.empty(shape, dtype=torch.int32) for _ in range(size)]])
    same("allgather into a tensor", lambda ts: dist.all_gather_into_tensor(ts[1], ts[0]),
         [x, torch.empty((size * 5, 7), dtype=torch.int32)])
    outputs = [torch.empty(shape, dtype=torch.int32) for _ in range(size)] if rank == root else None
    same("gather", lambda ts: dist.gather(ts[0], ts[1], dst=root), [x, outputs])
    pieces = [input_of(100 + r, shape, torch.int64) for r in range(size)] if rank == 0 else None
    same("scatter", lambda ts: dist.scatter(ts[0], ts[1], src=0), [torch.empty(shape, dtype=torch.int64), pieces])
    xs = [input_of(rank * size + r, shape, torch.float32) for r in range(size)]
    same("reduce_scatter", lambda ts: dist.reduce_scatter(ts[0], ts[1]), [torch.empty(shape), xs])
    same("reduce_scatter from a tensor", lambda ts: dist.reduce_scatter_tensor(ts[0], ts[1]),
         [torch.empty(shape), torch.cat(xs)])
    same("reduce_scatter, uneven", lambda ts: dist.reduce_scatter(ts[0], ts[1]),
         [torch.empty(rank + 2), [input_of(rank * size + r, (r + 2,), torch.float32) for r in range(size)]])
    same("alltoall, equal", lambda ts: dist.all_to_all_single(ts[1], ts[0]),
         [input_of(rank, (size * 3, 2), torch.float32), torch.empty((size * 3, 2))])
    send = [(rank + d) % 3 + 1 for d in range(size)]
    recv = [(s + rank) % 3 + 1 for s in range(size)]
    same("alltoall, uneven splits", lambda ts: dist.all_to_all_single(ts[1], ts[0], recv, send),
         [input_of(rank, (sum(send), 3), torch.int32), torch.empty((sum(recv), 3), dtype=torch.int32)])
    same("alltoall, list of tensors", lambda ts: dist.all_to_all(ts[1], ts[0]),
         [[input_of(rank * 10 + d, (d + 1,), torch.int64) for d in range(size)],
          [torch.empty((rank + 1,), dtype=torch.int64) for _ in range(size)]])
    shapes = [(3,), (2, 5), (4, 1)]
    parts = [input_of(rank * 3 + i, s, torch.float32) for i, s in enumerate(shapes)]
    same("allreduce_coalesced", lambda ts: dist.all_reduce_coalesced(ts), parts)
    if hasattr(dist, "_coalescing_manager") and int(torch.__version__.split(".")[0]) >= 2:
        def gathered(ts):
            with dist._coalescing_manager(async_ops=True) as cm:
                for y, x in zip(ts[1], ts[0]):
                    dist.all_gather_into_tensor(y, x)
            cm.wait()
        same("allgather into tensors, coalesced", gathered,
             [parts, [torch.empty((size * s[0],) + s[1:]) for s in shapes]])

    nxt, prv = (rank + 1) % size, (rank - 1) % size

    def ring(ts):
        for w in (dist.isend(ts[0], nxt, tag=3), dist.irecv(ts[1], prv, tag=3)):
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
        c.true("a call mixing CPU and CUDA tensors is refused, naming the devices", "cuda" in str(e) and "cpu" in str(e),
               str(e))


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
    calls_on_gpu(c, dist, torch, size, rank, dev)
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

#!/usr/bin/env python3
"""allreduce of sparse COO tensors on dtrain, against Gloo's on the same inputs, in real processes:

    python3 sparse_against_gloo.py [--ranks 3] [--module-dir DIR]

- sparse tensors of several layouts (2 sparse dimensions; 1 sparse and 1 dense, as an embedding's
  gradient; float32, float64, int64), whose entries overlap across ranks, one rank with none, all
  ranks with none, and an input with repeated indices: the sum equals Gloo's (exactly for
  integers, within float tolerance otherwise), is coalesced, and is the same bits on every rank;
- DDP training an nn.Embedding(sparse=True) model over dtrain and over Gloo from the same start
  ends with the same parameters;
- a reduce op other than SUM, and ranks whose tensors differ in size, number of dimensions or
  dtype, are refused with errors that say so, on every rank, and the group goes on working.
The launcher passes only if every rank reports every check passed.
"""
import os
import sys
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from against_gloo import Checker, finish, launch_or_run  # noqa: E402


def sparse_input(torch, rank, sizes, sparse_dims, nnz, dtype, seed):
    """A sparse tensor whose indices are drawn from a small range, so ranks' entries overlap."""
    g = torch.Generator().manual_seed(seed * 100 + rank)
    indices = torch.stack([torch.randint(0, sizes[d], (nnz,), generator=g) for d in range(sparse_dims)])
    dense = list(sizes[sparse_dims:])
    if dtype.is_floating_point:
        values = torch.randn([nnz] + dense, generator=g, dtype=torch.float64).to(dtype)
    else:
        values = torch.randint(-50, 50, [nnz] + dense, generator=g).to(dtype)
    return torch.sparse_coo_tensor(indices, values, sizes)


def same_on_every_rank(c, dist, torch, name, x, gloo, size):
    dense = x.to_dense().flatten().view(torch.uint8) if x.dtype != torch.int64 else x.to_dense().flatten()
    every = [torch.empty_like(dense) for _ in range(size)]
    dist.all_gather(every, dense, group=gloo)
    c.true(f"{name}: the same bits on every rank", all(torch.equal(e, dense) for e in every))


def sums(c, dist, torch, rank, size, gloo):
    cases = [  # name, sizes, sparse dims, entries of rank r, dtype
        ("2 sparse dims float32", (10, 4), 2, lambda r: 6 + r, torch.float32),
        ("embedding gradient float64", (20, 8), 1, lambda r: 5, torch.float64),
        ("int64", (7, 3, 2), 2, lambda r: 4 + 2 * r, torch.int64),
        ("rank 1 has no entries", (9, 3), 1, lambda r: 0 if r == 1 else 3, torch.float32),
        ("no rank has entries", (5, 5), 2, lambda r: 0, torch.float64),
    ]
    for seed, (name, sizes, sparse_dims, nnz, dtype) in enumerate(cases):
        mine = sparse_input(torch, rank, sizes, sparse_dims, nnz(rank), dtype, seed)
        ref = mine.clone()
        dist.all_reduce(mine)
        dist.all_reduce(ref, group=gloo)
        exact = not dtype.is_floating_point
        c.same(f"sparse allreduce, {name}", mine.to_dense(), ref.to_dense(), exact)
        c.true(f"sparse allreduce, {name}: the sum is coalesced", mine.is_coalesced())
        ref = ref.coalesce()
        c.true(f"sparse allreduce, {name}: Gloo's entries, no more", mine._nnz() == ref._nnz()
               and torch.equal(mine._indices(), ref._indices()), f"({mine._nnz()} entries, Gloo's {ref._nnz()})")
        same_on_every_rank(c, dist, torch, f"sparse allreduce, {name}", mine, gloo, size)
    # repeated indices within a rank's own input, uncoalesced as given
    x = torch.sparse_coo_tensor(torch.tensor([[1, 1, 3]]), torch.tensor([1.0, 2.0, float(rank)]), (5,))
    ref = x.clone()
    dist.all_reduce(x)
    dist.all_reduce(ref, group=gloo)
    c.same("sparse allreduce of an uncoalesced input", x.to_dense(), ref.to_dense(), True)


def ddp(c, dist, torch, rank, gloo):
    """DDP with a sparse embedding over dtrain and over Gloo, from the same start, same batches."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Embedding(50, 8, sparse=True), torch.nn.Flatten(), torch.nn.Linear(32, 3))

    final = []
    for group in (None, gloo):
        net = DDP(model(), process_group=group)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(7 + rank)
        for _ in range(4):
            ids = torch.randint(0, 50, (6, 4), generator=g)
            y = torch.randint(0, 3, (6,), generator=g)
            torch.nn.functional.cross_entropy(net(ids), y).backward()
            opt.step()
            opt.zero_grad()
        final.append(torch.cat([p.detach().flatten() for p in net.parameters()]))
    c.same("DDP with a sparse embedding: the parameters after training", final[0], final[1], False)
    start = torch.cat([p.detach().flatten() for p in model().parameters()])
    c.true("DDP with a sparse embedding: training moved the parameters", not torch.allclose(final[0], start))


def refusals(c, dist, torch, rank):
    x = sparse_input(torch, rank, (6, 2), 1, 3, torch.float32, 9)
    try:
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
        c.true("MAX of a sparse tensor refused", False, "(no error)")
    except RuntimeError as e:
        c.true("MAX of a sparse tensor refused, saying sparse tensors are summed", "ReduceOp.SUM" in str(e), str(e))
    y = sparse_input(torch, rank, (6, 2 + (rank == 1)), 1, 3, torch.float32, 10)
    try:
        dist.all_reduce(y)
        c.true(f"rank {rank}: sizes that differ refused", False, "(no error)")
    except RuntimeError as e:
        c.true(f"rank {rank}: sizes that differ refused, naming a rank whose tensor differs",
               "differs" in str(e), str(e))
    w = sparse_input(torch, rank, (6, 2, 1) if rank == 1 else (6, 2), 1, 3, torch.float32, 11)
    try:
        dist.all_reduce(w)
        c.true(f"rank {rank}: a different number of dimensions refused", False, "(no error)")
    except RuntimeError as e:
        c.true(f"rank {rank}: a different number of dimensions refused, saying so", "dimensions" in str(e), str(e))
    v = sparse_input(torch, rank, (6, 2), 1, 3, torch.float64 if rank == 2 else torch.float32, 12)
    try:
        dist.all_reduce(v)
        c.true(f"rank {rank}: a different dtype refused", False, "(no error)")
    except RuntimeError as e:
        c.true(f"rank {rank}: a different dtype refused, naming a rank whose tensor differs", "differs" in str(e),
               str(e))
    z = torch.ones(4)
    dist.all_reduce(z)
    c.same("the group reduces after the refusals", z, torch.full((4,), float(dist.get_world_size())), True)


def rank_main(args):
    rank = int(os.environ["RANK"])
    if args.module_dir:
        sys.path.insert(0, args.module_dir)
    import torch
    import torch.distributed as dist
    import dtrain_torch  # noqa: F401  (registers the backend)

    dist.init_process_group("dtrain", init_method="env://", timeout=timedelta(seconds=60))
    size = dist.get_world_size()
    gloo = dist.new_group(list(range(size)), backend="gloo")
    c = Checker(rank)
    sums(c, dist, torch, rank, size, gloo)
    ddp(c, dist, torch, rank, gloo)
    refusals(c, dist, torch, rank)
    return finish(c, dist, gloo, rank)


if __name__ == "__main__":
    sys.exit(launch_or_run(__doc__, rank_main, ranks=3))

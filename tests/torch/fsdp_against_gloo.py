#!/usr/bin/env python3
"""FSDP (torch 2's fully_shard) trained over dtrain's backend and over Gloo, in the same ranks.

    python3 fsdp_against_gloo.py --ranks 2 [--module-dir DIR]

Each rank builds the same small model twice (same seed), shards one copy over a device mesh of
the "dtrain" default group and the other over a Gloo group of the same ranks, and trains both on
the same batches: FSDP gathers the parameters with allgather-into-tensor (coalesced) and reduces
the gradients with reduce-scatter. The losses of every step and the final parameters must agree
within float tolerance (the two backends sum in different orders). Passes only if every rank does.
With 4 ranks it then trains HSDP on a 2x2 device mesh (shard within pairs, replicate across) the
same way, the dtrain mesh's sub-groups made by init_device_mesh. Needs torch 2.6 or later
(fully_shard public); CMake registers it only then.
"""
import os
import sys
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from against_gloo import Checker, finish, launch_or_run  # noqa: E402

STEPS = 6


def new_model(torch):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 48), torch.nn.ReLU(),
                               torch.nn.Linear(48, 10))


def train(torch, mesh, rank):
    from torch.distributed.fsdp import fully_shard
    model = new_model(torch)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    batches = torch.Generator().manual_seed(100 + rank)
    losses = []
    for _ in range(STEPS):
        x = torch.randn(16, 32, generator=batches)
        y = torch.randint(0, 10, (16,), generator=batches)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    # every rank's shards, gathered into whole parameters (an allgather of each)
    return torch.stack(losses), torch.cat([p.full_tensor().flatten() for p in model.parameters()])


def rank_main(args):
    if args.module_dir:
        sys.path.insert(0, args.module_dir)
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    import dtrain_torch  # noqa: F401  (registers the backend)

    dist.init_process_group("dtrain", init_method="env://", timeout=timedelta(seconds=60))
    rank, size = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(list(range(size)), backend="gloo")
    c = Checker(rank)
    losses, params = train(torch, DeviceMesh.from_group(dist.group.WORLD, "cpu"), rank)
    ref_losses, ref_params = train(torch, DeviceMesh.from_group(gloo, "cpu"), rank)
    c.same("the loss of every step", losses, ref_losses, False)
    c.same("the parameters after training", params, ref_params, False)
    start = torch.cat([p.detach().flatten() for p in new_model(torch).parameters()])
    c.true("training moved the parameters", not torch.allclose(params, start))
    if size == 4:
        hybrid(c, torch, dist, rank)
    return finish(c, dist, gloo, rank)


def hybrid(c, torch, dist, rank):
    """HSDP on a 2x2 mesh: shard within a pair, replicate across pairs. The dtrain mesh comes from
    init_device_mesh, whose sub-groups are dtrain groups DeviceMesh makes itself; the Gloo mesh
    from Gloo groups of the same ranks."""
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    names = ("replicate", "shard")
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=names)
    layout = torch.arange(4).view(2, 2)
    rows = [dist.new_group(r.tolist(), backend="gloo") for r in layout]  # shard groups: {0, 1}, {2, 3}
    cols = [dist.new_group(r.tolist(), backend="gloo") for r in layout.t()]  # replicate groups: {0, 2}, {1, 3}
    gloo_mesh = DeviceMesh.from_group([cols[rank % 2], rows[rank // 2]], "cpu", mesh=layout, mesh_dim_names=names)
    c.true("the dtrain mesh's groups are dtrain's", all(dist.get_backend(mesh.get_group(n)) == "dtrain" for n in names),
           str([dist.get_backend(mesh.get_group(n)) for n in names]))
    losses, params = train(torch, mesh, rank)
    ref_losses, ref_params = train(torch, gloo_mesh, rank)
    c.same("HSDP: the loss of every step", losses, ref_losses, False)
    c.same("HSDP: the parameters after training", params, ref_params, False)


if __name__ == "__main__":
    sys.exit(launch_or_run(__doc__, rank_main))

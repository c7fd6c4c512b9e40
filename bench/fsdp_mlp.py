#!/usr/bin/env python3
"""PyTorch FSDP on CPU with the sharded_mlp example's model and recipe: 784-1024x4-10 MLP on
Fashion-MNIST, Adam (lr 1e-3), global batch 128 split across ranks, one thread per process, each
Linear layer its own FSDP unit (FSDP2's fully_shard; reshard_after_forward=True is FULL_SHARD,
False is SHARD_GRAD_OP) over gloo. Prints one JSON line from rank 0: samples/s over the epoch's
steps, test accuracy, and the largest growth of a rank's peak resident memory over the steps
(VmHWM reset before the model is built, as the example does).

  torchrun --nproc-per-node 4 bench/fsdp_mlp.py [--reshard-after-forward 1] [--limit-train 8192]

Run by bench/sharded_speed.py, alternating with dtrain's trainers.
"""
import argparse
import gzip
import json
import os
import time

import numpy as np
import torch
import torch.distributed as dist


def load(directory, prefix):
    def read(stem):
        path = os.path.join(directory, stem)
        opener = open if os.path.exists(path) else gzip.open
        with opener(path if os.path.exists(path) else path + ".gz", "rb") as f:
            return f.read()
    images = np.frombuffer(read(f"{prefix}-images-idx3-ubyte"), dtype=np.uint8, offset=16).reshape(-1, 784)
    labels = np.frombuffer(read(f"{prefix}-labels-idx1-ubyte"), dtype=np.uint8, offset=8)
    return torch.from_numpy(images.astype(np.float32) / 255.0), torch.from_numpy(labels.astype(np.int64))


def status_bytes(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return float(line.split()[1]) * 1024
    return 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--hidden", default="1024,1024,1024,1024")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--limit-train", type=int, default=8192)
    ap.add_argument("--reshard-after-forward", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    rank, ranks = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (ranks,))
    train_x, train_y = load(args.data, "train")
    test_x, test_y = load(args.data, "t10k")
    train_x, train_y = train_x[:args.limit_train], train_y[:args.limit_train]

    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    rss_start = status_bytes("VmRSS")
    torch.manual_seed(1)
    widths = [784] + [int(h) for h in args.hidden.split(",")] + [10]
    layers = []
    for i in range(len(widths) - 1):
        layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh, reshard_after_forward=bool(args.reshard_after_forward))
    fully_shard(model, mesh=mesh, reshard_after_forward=bool(args.reshard_after_forward))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    loss_fn = torch.nn.CrossEntropyLoss()

    local = args.batch // ranks
    generator = torch.Generator().manual_seed(1)
    order = torch.randperm(len(train_y), generator=generator)
    shard = order[rank::ranks]
    steps = len(shard) // local
    dist.barrier()
    start = time.perf_counter()
    for step in range(steps):
        idx = shard[step * local:(step + 1) * local]
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(train_x[idx]), train_y[idx])
        loss.backward()
        optimizer.step()
    dist.barrier()
    seconds = time.perf_counter() - start
    growth = torch.tensor([status_bytes("VmHWM") - rss_start])
    dist.all_reduce(growth, op=dist.ReduceOp.MAX)

    share = (len(test_y) + ranks - 1) // ranks
    hits = torch.zeros(1)
    with torch.no_grad():
        xs, ys = test_x[rank * share:(rank + 1) * share], test_y[rank * share:(rank + 1) * share]
        hits += (model(xs).argmax(dim=1) == ys).sum()
    dist.all_reduce(hits)
    if rank == 0:
        print(json.dumps({"trainer": "fsdp2_" + ("full_shard" if args.reshard_after_forward else "shard_grad_op"),
                          "ranks": ranks, "samples_per_second": steps * args.batch / seconds,
                          "test_accuracy": hits.item() / len(test_y), "rss_growth_bytes": growth.item(),
                          "torch": torch.__version__}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""examples/fashion_mnist_parallel's model and recipe on PyTorch's own pipeline parallelism
(torch.distributed.pipelining, PyTorch >= 2.4, gloo on the CPU), for bench/fashion_mnist_parallel.py
--torch: MLP 784-1024-1024-1024-10 cut into 2 stages after the second linear layer (where
dtrain's partitioner cuts it by parameter count), SGD momentum 0.9, lr 0.05 with cosine decay,
global batch 128 in 4 micro-batches, one thread per process. Writes a JSON summary like the
example's (--json).

Debian's python3-torch (1.13) predates torch.distributed.pipelining; run it from a virtual
environment with a recent torch from PyPI:

  python3 -m venv /tmp/torch-venv && /tmp/torch-venv/bin/pip install torch numpy
  /tmp/torch-venv/bin/python bench/peers/torch_pipeline_fashion_mnist.py --schedule 1f1b --epochs 1
"""
import os
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import json
import math
import socket
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddp_fashion_mnist import load  # noqa: E402  (the same reader of the IDX files)


def model(hidden):
    widths = [784] + hidden + [10]
    layers = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def worker(rank, args, port, scratch):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(args.seed)
    x_train, y_train = load(args.data, "train")
    x_test, y_test = load(args.data, "t10k")
    if args.limit_train:
        x_train, y_train = x_train[:args.limit_train], y_train[:args.limit_train]
    full = model(args.hidden)
    cut = 4  # after Linear, ReLU, Linear, ReLU: the first two layers on stage 0
    part = full[:cut] if rank == 0 else full[cut:]
    micro = args.batch // args.micro_batches
    stage = PipelineStage(part, rank, 2, torch.device("cpu"))
    loss_fn = nn.CrossEntropyLoss()
    schedule_type = Schedule1F1B if args.schedule == "1f1b" else ScheduleGPipe
    schedule = schedule_type(stage, n_microbatches=args.micro_batches, loss_fn=loss_fn)
    opt = torch.optim.SGD(part.parameters(), lr=args.lr, momentum=0.9)
    steps = len(y_train) // args.batch
    total = steps * args.epochs
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, total) / total)))
    generator = torch.Generator().manual_seed(args.seed)
    seconds = 0.0
    for epoch in range(args.epochs):
        order = torch.randperm(len(y_train), generator=generator)
        start = time.perf_counter()
        for s in range(steps):
            idx = order[s * args.batch:(s + 1) * args.batch]
            opt.zero_grad(set_to_none=True)
            if rank == 0:
                schedule.step(x_train[idx])
            else:
                losses = []
                schedule.step(target=y_train[idx], losses=losses)
            opt.step()
            sched.step()
        seconds += time.perf_counter() - start
    # Test accuracy: rank 0 puts the two halves together.
    torch.save(part.state_dict(), os.path.join(scratch, f"stage{rank}.pt"))
    dist.barrier()
    if rank == 0:
        whole = model(args.hidden)
        whole[:cut].load_state_dict(torch.load(os.path.join(scratch, "stage0.pt")))
        whole[cut:].load_state_dict(torch.load(os.path.join(scratch, "stage1.pt")))
        with torch.no_grad():
            accuracy = (whole(x_test).argmax(1) == y_test).float().mean().item()
        rate = steps * args.batch * args.epochs / seconds
        print(f"torch.distributed.pipelining {args.schedule}: {rate:.0f} samples/s, test accuracy {accuracy:.4f}")
        if args.json:
            json.dump({"framework": f"torch {torch.__version__} pipelining", "schedule": args.schedule,
                       "ranks": 2, "dp": 1, "pp": 2, "tp": 1, "micro_batches": args.micro_batches,
                       "samples_per_second": rate,
                       "bubble": float("nan"), "test_accuracy": accuracy}, open(args.json, "w"))
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--schedule", choices=["gpipe", "1f1b"], default="1f1b")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--micro-batches", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--hidden", type=lambda s: [int(x) for x in s.split(",")], default=[1024, 1024, 1024])
    p.add_argument("--limit-train", type=int, default=0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", default="")
    args = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as scratch:
        mp.spawn(worker, args=(args, port, scratch), nprocs=2, join=True)


if __name__ == "__main__":
    main()

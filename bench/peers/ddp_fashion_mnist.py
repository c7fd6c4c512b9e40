#!/usr/bin/python3
"""The Fashion-MNIST recipe with PyTorch DDP (gloo backend), for bench/fashion_mnist_vs_ddp.py.

MLP 784-256-128-10, SGD momentum 0.9, lr 0.05, global batch 128 split across ranks, one thread per
process, data from Debian's dataset-fashion-mnist. Uses only Debian packages (python3-torch).
Prints per-epoch lines and writes a JSON summary like dtrain's example (--json).

  /usr/bin/python3 bench/peers/ddp_fashion_mnist.py --ranks 2 --epochs 5
  python3 bench/peers/ddp_fashion_mnist.py --device cuda --backend nccl --epochs 10   # the peer of fashion_mnist_gpu
  /usr/bin/python3 bench/peers/ddp_fashion_mnist.py --ranks 2 --backend dtrain \
      --module-dir build/extensions/torch_backend
"""
import os
os.environ.setdefault("OMP_NUM_THREADS", "1")  # one thread per process, BLAS included
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import gzip
import json
import os
import socket
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn


def load(directory, prefix):
    def read(stem, offset):
        path = os.path.join(directory, stem)
        opener = open if os.path.exists(path) else gzip.open
        with opener(path if os.path.exists(path) else path + ".gz", "rb") as f:
            return np.frombuffer(f.read(), dtype=np.uint8, offset=offset)

    images = read(f"{prefix}-images-idx3-ubyte", 16).reshape(-1, 784).astype(np.float32) / 255.0
    labels = read(f"{prefix}-labels-idx1-ubyte", 8).astype(np.int64)
    return torch.from_numpy(images), torch.from_numpy(labels)


def worker(rank, args, port):
    torch.set_num_threads(1)
    if args.backend == "dtrain":  # dtrain's torch.distributed backend (extensions/torch_backend)
        if args.module_dir:
            sys.path.insert(0, args.module_dir)
        import dtrain_torch  # noqa: F401  (registers "dtrain")
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group(args.backend, rank=rank, world_size=args.ranks)
    torch.manual_seed(args.seed)
    gpu = args.device == "cuda"
    device = torch.device(f"cuda:{rank % torch.cuda.device_count()}" if gpu else "cpu")
    x_train, y_train = (t.to(device) for t in load(args.data, "train"))
    x_test, y_test = (t.to(device) for t in load(args.data, "t10k"))
    model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10)).to(device)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if gpu else None)

    def synchronize():  # the GPU's queued work belongs to the time it took
        if gpu:
            torch.cuda.synchronize(device)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    local_batch = args.batch // args.ranks
    sampler = torch.utils.data.distributed.DistributedSampler(
        range(len(y_train)), num_replicas=args.ranks, rank=rank, shuffle=True, seed=args.seed, drop_last=True)
    steps = len(sampler) // local_batch

    def step(idx, sync=True):
        opt.zero_grad(set_to_none=True)
        if sync:
            loss = loss_fn(ddp(x_train[idx]), y_train[idx])
            loss.backward()
        else:
            with ddp.no_sync():
                loss = loss_fn(ddp(x_train[idx]), y_train[idx])
                loss.backward()
        opt.step()
        return loss

    def accuracy():
        with torch.no_grad():
            share = (len(y_test) + args.ranks - 1) // args.ranks
            first, last = min(len(y_test), rank * share), min(len(y_test), (rank + 1) * share)
            hits = (model(x_test[first:last]).argmax(1) == y_test[first:last]).sum().to(torch.float64)
            dist.all_reduce(hits)
            return hits.item() / len(y_test)

    epoch_seconds, curve, train_seconds = [], [], 0.0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        order = torch.tensor(list(iter(sampler)), device=device)
        dist.barrier()
        synchronize()
        start = time.perf_counter()
        for s in range(steps):
            step(order[s * local_batch:(s + 1) * local_batch])
        synchronize()
        seconds = time.perf_counter() - start
        train_seconds += seconds
        epoch_seconds.append(seconds)
        acc = accuracy()
        curve.append([train_seconds, acc])
        if rank == 0:
            print(f"ddp epoch {epoch + 1}/{args.epochs}  test accuracy {acc:.4f}  {seconds:.2f} s  "
                  f"{steps * args.batch / seconds:.0f} samples/s", flush=True)

    # The communication share: a step with gradient sync against the same step without it.
    order = torch.tensor(list(iter(sampler)), device=device)
    calib = min(steps, 200)
    timings = {}
    for sync in (False, True, False, True):
        dist.barrier()
        synchronize()
        start = time.perf_counter()
        for s in range(calib):
            step(order[s * local_batch:(s + 1) * local_batch], sync)
        synchronize()
        timings.setdefault(sync, []).append(time.perf_counter() - start)
    share = max(0.0, 1.0 - min(timings[False]) / min(timings[True])) if args.ranks > 1 else 0.0
    if rank == 0:
        result = {"framework": "pytorch-ddp", "torch": torch.__version__, "backend": args.backend,
                  "device": torch.cuda.get_device_name(device) if gpu else "cpu", "ranks": args.ranks,
                  "epochs": args.epochs,
                  "global_batch": args.batch, "samples_per_second": steps * args.batch * args.epochs / train_seconds,
                  "epoch_seconds": epoch_seconds, "communication_share": share, "test_accuracy": curve[-1][1],
                  "curve": curve}
        print(f"ddp final test accuracy {curve[-1][1]:.4f}; {result['samples_per_second']:.0f} samples/s; "
              f"communication {100 * share:.1f}% of a step", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--json", default="")
    p.add_argument("--backend", default="gloo",
                   help="torch.distributed backend: gloo, dtrain (CPU); nccl with --device cuda")
    p.add_argument("--module-dir", default="", help="with --backend dtrain: where dtrain_torch was built "
                   "(build/extensions/torch_backend)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where the model and the data live")
    args = p.parse_args()
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(args, port), nprocs=args.ranks, join=True)


if __name__ == "__main__":
    main()

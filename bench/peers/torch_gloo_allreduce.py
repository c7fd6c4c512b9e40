#!/usr/bin/env python3
"""torch.distributed's Gloo all_reduce (float32 sum, CPU tensors) in bench_collectives' JSON, for
bench/compare_openmpi.py --peers gloo: the peer the many-core issue measured, as a user runs it.

One process per rank (torch.multiprocessing, spawn), the default group on Gloo over loopback TCP.
For each size: two warm-up calls, as many calls as fill about SECONDS (rank 0's count, broadcast),
the slowest rank's mean per call; then one call on fresh data, checked element by element. Rank 0
prints one JSON line per size.

  python3 bench/peers/torch_gloo_allreduce.py --ranks 4 -t 0.3 4096 1048576
"""
import os
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import json
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def fill(t, rank):
    """Rank r's input: (r + 1) * (i % 7), as mpi_allreduce's."""
    torch.remainder(torch.arange(t.numel(), dtype=torch.float32), 7, out=t)
    t.mul_(rank + 1)


def worker(rank, args, port):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.ranks)
    size = args.ranks
    for nbytes in args.sizes:
        t = torch.empty(nbytes // 4, dtype=torch.float32)
        fill(t, rank)
        t0 = time.perf_counter()
        dist.all_reduce(t)
        dist.all_reduce(t)
        iters = torch.tensor([min(10000.0, max(3.0, args.seconds / max((time.perf_counter() - t0) / 2, 1e-7)))],
                             dtype=torch.float64)
        dist.broadcast(iters, 0)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(int(iters.item())):
            dist.all_reduce(t)
        slowest = torch.tensor([(time.perf_counter() - t0) / int(iters.item())], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        fill(t, rank)
        dist.all_reduce(t)
        expected = torch.remainder(torch.arange(t.numel(), dtype=torch.float32), 7) * (size * (size + 1) / 2)
        wrong = torch.tensor([int((t != expected).sum().item())], dtype=torch.int64)
        dist.all_reduce(wrong)
        if rank == 0:
            algbw = nbytes / slowest.item() / 1e9
            print(json.dumps({"peer": "gloo", "algorithm": f"torch {torch.__version__} gloo", "ranks": size,
                              "bytes": nbytes, "time_us": round(slowest.item() * 1e6, 3), "algbw_GBps": round(algbw, 4),
                              "busbw_GBps": round(algbw * 2 * (size - 1) / size, 4), "wrong": int(wrong.item())}),
                  flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, required=True)
    ap.add_argument("-t", "--seconds", type=float, default=0.3)
    ap.add_argument("sizes", type=int, nargs="+", help="message sizes in bytes (multiples of 4)")
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(worker, args=(args, port), nprocs=args.ranks, start_method="spawn")
    return 0


if __name__ == "__main__":
    sys.exit(main())

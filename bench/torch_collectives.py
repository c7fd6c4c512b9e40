#!/usr/bin/env python3
"""all_reduce through torch.distributed over dtrain's backend and over Gloo, in the same processes.

Each rank joins the default group on "dtrain" and a Gloo group over the same ranks, then times
all_reduce (float32 sum) at each size and device, the two backends alternated round by round. On
CUDA tensors both backends stage through pinned host memory, so it also times the staging alone
(a copy to a pinned host tensor and back on the current stream, the least any staged call pays)
and dtrain staged by hand (that copy, a wait for it, dtrain's all_reduce on the host tensor, the
copy back). Against the module's staged call, that separates what the copies cost, what the host
collective costs and what the module's stream and thread hand-offs add.

Prints nccl-tests' columns (time is the slowest rank's mean per call, the median over rounds) and
the median over rounds of Gloo's time over dtrain's from the same round; --json writes every round.

  /usr/bin/python3 bench/torch_collectives.py --module-dir build/extensions/torch_backend
  python3 bench/torch_collectives.py --module-dir DIR --ranks 2 4 --device cpu cuda --json out.json
"""
import os
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import json
import socket
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

STAGING = "staging copies"
BY_HAND = "dtrain by hand"


def iterations(nbytes):
    return max(5, min(100, (32 << 20) // nbytes))


def time_calls(call, iters, device):
    call()  # warm-up: connections, pinned buffers, the caching allocator
    call()
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        call()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / iters


def check_sum(tensor, group, size, what):
    """One all_reduce of known inputs, so a wrong result cannot pass as a fast one."""
    tensor.fill_(dist.get_rank() + 1)
    dist.all_reduce(tensor, group=group)
    want = size * (size + 1) / 2
    if not torch.all(tensor == want):
        raise SystemExit(f"{what}: all_reduce gave {tensor.flatten()[0].item()}, expected {want}")


def worker(rank, args, port, out):
    torch.set_num_threads(1)
    sys.path.insert(0, args.module_dir)
    import dtrain_torch  # noqa: F401  (registers "dtrain")
    size = args.ranks_now
    dist.init_process_group("dtrain", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    gloo = dist.new_group(backend="gloo")
    groups = {"dtrain": dist.group.WORLD, "gloo": gloo}
    rows = []
    for device in args.device:
        if device == "cuda":
            torch.cuda.set_device(0)
        for nbytes in args.sizes:
            tensor = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
            host = torch.empty(tensor.numel(), dtype=tensor.dtype, pin_memory=True) if device == "cuda" else None
            for backend, group in groups.items():
                check_sum(tensor, group, size, f"{backend} on {device}, {nbytes} B")
            iters = iterations(nbytes)
            for r in range(args.rounds):
                order = ["gloo", "dtrain"] if r % 2 == 0 else ["dtrain", "gloo"]
                for backend in order + ([STAGING, BY_HAND] if host is not None else []):
                    dist.barrier(group=gloo)
                    if backend == STAGING:
                        def call():
                            host.copy_(tensor, non_blocking=True)
                            tensor.copy_(host, non_blocking=True)
                    elif backend == BY_HAND:
                        def call():
                            host.copy_(tensor, non_blocking=True)
                            torch.cuda.current_stream().synchronize()
                            dist.all_reduce(host)
                            tensor.copy_(host, non_blocking=True)
                    else:
                        def call(group=groups[backend]):
                            dist.all_reduce(tensor, group=group)
                    seconds = torch.tensor([time_calls(call, iters, device)], dtype=torch.float64)
                    dist.all_reduce(seconds, op=dist.ReduceOp.MAX, group=gloo)
                    rows.append({"ranks": size, "device": device, "bytes": nbytes, "backend": backend,
                                 "round": r, "iterations": iters, "seconds": seconds.item()})
        if rank == 0:  # after each device, so one that fails later leaves the others' rows
            with open(out, "w") as f:
                json.dump(rows, f)
    dist.barrier(group=gloo)
    dist.destroy_process_group()


def report(rows, ranks, device):
    print(f"# {ranks} ranks, tensors on {device}: all_reduce float32 sum")
    print(f"# {'size':>10} {'count':>10} {'type':>6} {'redop':>6} {'backend':>15} {'time':>9} {'algbw':>7} "
          f"{'busbw':>7} {'gloo/dtrain':>11}")
    print(f"# {'(B)':>10} {'(elements)':>10} {'':>6} {'':>6} {'':>15} {'(us)':>9} {'(GB/s)':>7} {'(GB/s)':>7} "
          f"{'(median)':>11}")
    for nbytes in sorted({r["bytes"] for r in rows}):
        mine = [r for r in rows if r["bytes"] == nbytes]
        by = {b: sorted((r for r in mine if r["backend"] == b), key=lambda r: r["round"])
              for b in ("gloo", "dtrain", STAGING, BY_HAND)}
        ratio = statistics.median(g["seconds"] / d["seconds"] for g, d in zip(by["gloo"], by["dtrain"]))
        for backend, runs in by.items():
            if not runs:
                continue
            seconds = statistics.median(r["seconds"] for r in runs)
            algbw = nbytes / seconds / 1e9
            busbw = algbw if backend == STAGING else algbw * 2 * (ranks - 1) / ranks
            shown = f"{ratio:.2f}x" if backend == "dtrain" else ""
            print(f"  {nbytes:>10} {nbytes // 4:>10} {'float':>6} {'sum':>6} {backend:>15} {seconds * 1e6:>9.1f} "
                  f"{algbw:>7.2f} {busbw:>7.2f} {shown:>11}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--module-dir", required=True, help="where dtrain_torch was built")
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    p.add_argument("--device", nargs="+", default=["cpu"], choices=["cpu", "cuda"])
    p.add_argument("--sizes", type=int, nargs="+", default=[4 << 10, 64 << 10, 1 << 20, 16 << 20],
                   help="message sizes in bytes (multiples of 4)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default="")
    args = p.parse_args()
    if "cuda" in args.device and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device")
    gpu = f", GPU {torch.cuda.get_device_name()}" if "cuda" in args.device else ""
    print(f"# machine: {os.cpu_count()} CPUs{gpu}; torch {torch.__version__}; {args.rounds} alternated rounds")
    everything, failed = [], ""
    for ranks in args.ranks:
        args.ranks_now = ranks
        with socket.socket() as s:  # a free port for the rendezvous
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            try:
                mp.spawn(worker, args=(args, port, out.name), nprocs=ranks, join=True)
            except mp.ProcessRaisedException as e:
                failed = f"{ranks} ranks: {e}"
            rows = json.load(out) if os.path.getsize(out.name) else []
        everything += rows
        for device in sorted({r["device"] for r in rows}, key=args.device.index):
            report([r for r in rows if r["device"] == device], ranks, device)
        if failed:
            break
    if args.json:
        with open(args.json, "w") as f:
            json.dump(everything, f, indent=1)
    if failed:
        raise SystemExit(failed)


if __name__ == "__main__":
    main()

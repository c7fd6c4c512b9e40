"""The c10d calls beyond the plain collectives, against Gloo: the coalesced forms, the calls FSDP
and DeviceMesh make (all_gather_into_tensor, reduce_scatter_tensor), every ordering of
point-to-point calls (receive first, batched, many in flight, beside collectives on another
thread), and the fault paths (a rank killed mid-allreduce; the interpreter exiting with the group
alive). c10d_against_gloo.py runs them."""

import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the harness beside this file
from against_gloo import input_of  # noqa: E402


def coalesced(c, dist, torch, gloo, size, rank):
    """The coalesced calls, one collective for several tensors of different shapes."""
    def flat(ts):
        return torch.cat([t.flatten() for t in ts])

    shapes = [(3,), (2, 5), (4, 1)]
    xs = [input_of(rank * 3 + i, s, torch.float32) for i, s in enumerate(shapes)]
    mine, ref = [x.clone() for x in xs], [x.clone() for x in xs]
    dist.all_reduce_coalesced(mine)
    dist.all_reduce_coalesced(ref, group=gloo)
    c.same("allreduce_coalesced", flat(mine), flat(ref), False)
    mine = [[torch.empty(s) for s in shapes] for _ in range(size)]  # [rank][input]
    ref = [[torch.empty(s) for s in shapes] for _ in range(size)]
    dist.all_gather_coalesced(mine, xs)
    dist.all_gather_coalesced(ref, xs, group=gloo)
    c.same("allgather_coalesced", flat(t for ts in mine for t in ts), flat(t for ts in ref for t in ts), True)
    if int(torch.__version__.split(".")[0]) < 2:
        return
    # torch 2's fast path, as FSDP and DTensor use it: into-tensor calls under a coalescing
    # manager become one allgather_into_tensor_coalesced / reduce_scatter_tensor_coalesced
    ints = [input_of(rank * 3 + i, s, torch.int64) for i, s in enumerate(shapes)]
    gathered = [torch.empty((size * s[0],) + s[1:], dtype=torch.int64) for s in shapes]
    with dist._coalescing_manager(async_ops=True) as cm:
        for y, x in zip(gathered, ints):
            dist.all_gather_into_tensor(y, x)
    cm.wait()
    want = [torch.cat([input_of(r * 3 + i, s, torch.int64) for r in range(size)]) for i, s in enumerate(shapes)]
    c.same("allgather into tensors, coalesced", flat(gathered), flat(want), True)
    wholes = [input_of(rank * 3 + i, (size * s[0],) + s[1:], torch.int64) for i, s in enumerate(shapes)]
    scattered = [torch.empty(s, dtype=torch.int64) for s in shapes]
    with dist._coalescing_manager(async_ops=True) as cm:
        for y, x in zip(scattered, wholes):
            dist.reduce_scatter_tensor(y, x)
    cm.wait()
    for i, (y, x) in enumerate(zip(scattered, wholes)):
        total = x.clone()
        dist.all_reduce(total, group=gloo)
        c.same(f"reduce_scatter from tensors, coalesced, #{i}", y, total.view(size, -1)[rank].view(y.shape), True)


def fsdp_calls(c, dist, torch, gloo, size, rank):
    """The calls FSDP makes, on any torch. fully_shard (torch 2) copies every parameter's shard into
    one flat buffer and gathers it with one async all_gather_into_tensor, and reduce-scatters the
    gradients, chunk-catted into one buffer, with one reduce_scatter_tensor (SUM); 1.13's
    FullyShardedDataParallel makes the same calls as _all_gather_base and _reduce_scatter_base.
    All reach ProcessGroup._allgather_base / _reduce_scatter_base, called here directly too.
    Gloo has neither: the reference is its list allgather and its allreduce."""
    from torch._C._distributed_c10d import AllgatherOptions, ReduceScatterOptions
    pg = dist.distributed_c10d._get_default_group()
    numels = (6, 10, 3)  # uneven parameter shards
    shard = torch.cat([input_of(rank * 4 + i, (n,), torch.float32) for i, n in enumerate(numels)])
    want = [torch.empty_like(shard) for _ in range(size)]
    dist.all_gather(want, shard, group=gloo)
    for how, gather in (("all_gather_into_tensor", lambda y: dist.all_gather_into_tensor(y, shard, async_op=True)),
                        ("ProcessGroup._allgather_base", lambda y: pg._allgather_base(y, shard, AllgatherOptions()))):
        y = torch.empty(size * shard.numel())
        gather(y).wait()
        c.same(f"FSDP's parameter allgather, {how}", y, torch.cat(want), True)
    grads = input_of(rank + 70, (size * sum(numels),), torch.float32)
    total = grads.clone()
    dist.all_reduce(total, group=gloo)
    opts = ReduceScatterOptions()
    opts.reduceOp = dist.ReduceOp.SUM
    for how, scatter in (("reduce_scatter_tensor", lambda y: dist.reduce_scatter_tensor(y, grads, async_op=True)),
                         ("ProcessGroup._reduce_scatter_base", lambda y: pg._reduce_scatter_base(y, grads, opts))):
        y = torch.empty(sum(numels))
        scatter(y).wait()
        c.same(f"FSDP's gradient reduce-scatter, {how}", y, total.view(size, -1)[rank], False)


def killed(c, dist, torch, size, rank):
    """The last rank dies (SIGKILL) mid-allreduce; the others must raise within a second, naming it."""
    store = dist.distributed_c10d._get_default_store()
    victim = size - 1
    x = torch.ones(1 << 22)  # 16 MiB: each allreduce takes a while
    for i in range(1000):
        if rank == victim and i == 5:
            store.set("killed_at", repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            dist.all_reduce(x)
        except RuntimeError as e:
            now = time.time()
            at = float(store.get("killed_at").decode())
            took = now - at
            print(f"rank {rank}: allreduce #{i} raised {took * 1000:.0f} ms after the kill: {e}", flush=True)
            c.true("the survivors raise within a second", took < 1.0, f"({took:.2f} s)")
            c.true("the error names the lost rank", f"rank {victim}" in str(e), str(e))
            if hasattr(dist, "DistBackendError"):  # torch 2: the type its own backends raise
                c.true("the error is a DistBackendError", isinstance(e, dist.DistBackendError), type(e).__name__)
            break
    else:
        c.true("an allreduce raised", False)
    # Rank 0 serves the store: it stays until every survivor has read from it.
    store.add("survivors_done", 1)
    deadline = time.monotonic() + 30
    while rank == 0 and store.add("survivors_done", 0) < size - 1 and time.monotonic() < deadline:
        time.sleep(0.01)


def exit_without_destroy(c, dist, torch, size, rank):
    """Many scripts never call destroy_process_group: the group ends as the interpreter does, with
    a collective still in flight. The launcher wants every rank to exit 0 within its deadline."""
    x = torch.ones(1000)
    dist.all_reduce(x)
    c.same("an allreduce before exit", x, torch.full((1000,), float(size)), True)
    dist.all_reduce(torch.ones(10), async_op=True)  # never waited for
    print(f"rank {rank}: {'PASS' if not c.failed else 'FAIL'} ({c.passed} checks passed); exiting", flush=True)


def p2p_orderings(c, dist, torch, gloo, size, rank):
    """Sends and receives in every order a program posts them, on dtrain and on Gloo: the same
    results, and dtrain finishes each at once (a receive that held back later sends would wait
    for the group's 30 s deadline)."""
    import threading
    import time
    nxt, prv = (rank + 1) % size, (rank - 1) % size

    def ring_receive_first(group):
        into = torch.empty(40, dtype=torch.float64)
        r = dist.irecv(into, prv, group=group, tag=21)
        time.sleep(0.05)  # the receive is posted, and waiting, before the send is called
        s = dist.isend(input_of(rank + 200, (40,), torch.float64), nxt, group=group, tag=21)
        r.wait()
        s.wait()
        return [into]

    def batched_receive_first(group):
        into = torch.empty(9, dtype=torch.float32)
        ops = [dist.P2POp(dist.irecv, into, prv, group, 22),
               dist.P2POp(dist.isend, input_of(rank + 300, (9,), torch.float32), nxt, group, 22)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        return [into]

    def swap_receive_first(group):  # ranks 0-1, 2-3, ...; an odd one out swaps with itself by copy
        peer = rank ^ 1
        mine = input_of(rank + 400, (1000,), torch.int64)
        if peer >= size:
            return [mine.clone()]
        into = torch.empty(1000, dtype=torch.int64)
        r = dist.irecv(into, peer, group=group, tag=23)
        time.sleep(0.05)
        s = dist.isend(mine, peer, group=group, tag=23)
        s.wait()  # the send waited first: it must not need the receive to finish
        r.wait()
        return [into]

    def many_in_flight(group):  # 12 receives from prv, then 12 sends to nxt, waited newest first
        intos = [torch.empty(k + 1, dtype=torch.float64) for k in range(12)]
        works = [dist.irecv(t, prv, group=group, tag=24) for t in intos]
        time.sleep(0.05)
        works += [dist.isend(input_of(rank * 100 + k, (k + 1,), torch.float64), nxt, group=group, tag=24)
                  for k in range(12)]
        for w in reversed(works):
            w.wait()
        return intos

    def out_of_order(group):  # rank 1 sends B, then A only once rank 0 has B: B's work must not wait for A's
        if rank > 1:
            dist.barrier(group=gloo)
            return []
        a, b = torch.empty(3), torch.empty(3)
        if rank == 0:
            ra = dist.irecv(a, 1, group=group, tag=25)
            rb = dist.irecv(b, 1, group=group, tag=26)
            rb.wait()
            dist.barrier(group=gloo)
            ra.wait()
            return [a, b]
        dist.isend(input_of(500, (3,), torch.float32), 0, group=group, tag=26).wait()
        dist.barrier(group=gloo)
        dist.isend(input_of(501, (3,), torch.float32), 0, group=group, tag=25).wait()
        return []

    def beside_collectives(group):  # a ring receive-first while another thread runs allreduces
        sums = []

        def reduce():
            for k in range(20):
                t = torch.full((64,), float(rank + k))
                dist.all_reduce(t, group=group)
                sums.append(t[0].item())
        other = threading.Thread(target=reduce)
        other.start()
        got = ring_receive_first(group)
        other.join()
        want = [float(size * (size - 1) // 2 + size * k) for k in range(20)]
        return got + [torch.tensor(sums if sums == want else [-1.0])]

    wanted = {
        "ring, receive first": lambda: [input_of(prv + 200, (40,), torch.float64)],
        "batch_isend_irecv, receive first": lambda: [input_of(prv + 300, (9,), torch.float32)],
        "two-rank swap, receive first": lambda: [input_of((rank ^ 1 if rank ^ 1 < size else rank) + 400, (1000,),
                                                          torch.int64)],
        "12 in flight, waited newest first": lambda: [input_of(prv * 100 + k, (k + 1,), torch.float64)
                                                      for k in range(12)],
        "a later receive completing first": lambda: [input_of(501, (3,), torch.float32),
                                                     input_of(500, (3,), torch.float32)] if rank == 0 else [],
        "beside allreduces on another thread": lambda: [input_of(prv + 200, (40,), torch.float64),
                                                        torch.tensor([float(size * (size - 1) // 2 + size * k)
                                                                      for k in range(20)])],
    }
    for name, run in (("ring, receive first", ring_receive_first),
                      ("batch_isend_irecv, receive first", batched_receive_first),
                      ("two-rank swap, receive first", swap_receive_first),
                      ("12 in flight, waited newest first", many_in_flight),
                      ("a later receive completing first", out_of_order),
                      ("beside allreduces on another thread", beside_collectives)):
        for backend, group in (("dtrain", None), ("gloo", gloo)):
            begun = time.monotonic()
            got = run(group)
            took = time.monotonic() - begun
            want = wanted[name]()
            c.true(f"p2p {name} on {backend}: as many tensors", len(got) == len(want))
            for k, (g, w) in enumerate(zip(got, want)):
                c.same(f"p2p {name} on {backend} [{k}]", g, w, True)
            if backend == "dtrain":
                c.true(f"p2p {name} on dtrain finishes at once", took < 5.0, f"took {took:.1f} s")
        dist.barrier(group=gloo)

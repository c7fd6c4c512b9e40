#!/usr/bin/env python3
"""Which path the backend's groups take, seen from the operating system, not from dtrain:

    python3 transport_paths.py --hosts a,a,a [--module-dir DIR]       # one host: shared memory only
    python3 transport_paths.py --hosts a,a,b [--module-dir DIR]       # two hosts: TCP across only
    python3 transport_paths.py --hosts a,a,a --transport tcp [...]    # DTRAIN_TRANSPORT=tcp: TCP only

One rank per entry of --hosts, each with that DTRAIN_HOST_ID (ranks with the same one share a
host, as dtrain decides it). Each rank reads its own sockets (/proc/self/fd, /proc/net/tcp*) and
shared-memory mappings (/proc/self/maps) and asserts, after init_process_group("dtrain"):
- after every rank sent 1 MiB to every other: a TCP connection (other than the store's) that
  carried it to each rank on another host, and none to a rank of its own host (none at all where
  every rank is on one host; where some are elsewhere, the TCP group connects every pair, and the
  kernel's byte counts show the neighbours' connections idle); a shared-memory segment mapped for
  each rank of its host (its own inbox among them) where it shares the host, none where alone;
- the world's allreduce has its closed-form result (the data went over those paths: the store
  carries none);
- new_group (of every rank, and of two) and their collectives and point-to-point calls open no
  socket and map no segment, while a Gloo group formed the same way does open sockets (the count
  sees new connections).
The launcher passes only if every rank reports every check passed.
"""
import argparse
import os
import socket
import struct
import sys
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from against_gloo import Checker, finish, launch  # noqa: E402


def socket_fds():
    """This process's sockets: {inode: file descriptor}."""
    found = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            found[int(link[len("socket:["):-1])] = int(fd)
    return found


def socket_inodes():
    return set(socket_fds())


def tcp_connections(store_port):
    """This process's established TCP connections that are not the store's, as the bytes each has
    carried: (sent and acknowledged, received), from the kernel's TCP_INFO."""
    inode_fd = socket_fds()
    carried = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.read().splitlines()[1:]:
                field = line.split()
                local, remote = int(field[1].rsplit(":", 1)[1], 16), int(field[2].rsplit(":", 1)[1], 16)
                fd = inode_fd.get(int(field[9]))
                if field[3] != "01" or fd is None or store_port in (local, remote):
                    continue
                with socket.socket(fileno=os.dup(fd)) as s:  # struct tcp_info: bytes_acked, bytes_received
                    acked, received = struct.unpack_from("<QQ", s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256),
                                                         120)
                carried.append((acked, received))
    return carried


def shm_segments():
    """The names of the dtrain shared-memory segments this process maps."""
    with open("/proc/self/maps") as f:
        return {line.split()[5] for line in f if "/dev/shm/dtrain-" in line}


def rank_main(args, hosts):
    os.environ["DTRAIN_HOST_ID"] = hosts[int(os.environ["RANK"])]
    if args.transport:
        os.environ["DTRAIN_TRANSPORT"] = args.transport
    if args.module_dir:
        sys.path.insert(0, args.module_dir)
    import torch
    import torch.distributed as dist
    import dtrain_torch  # noqa: F401  (registers the backend)

    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store_port = int(os.environ["MASTER_PORT"])
    dist.init_process_group("dtrain", init_method="env://", timeout=timedelta(seconds=30))
    c = Checker(rank)

    # What the paths must be, from the host list alone.
    neighbours = sum(h == hosts[rank] for h in hosts)  # this rank included
    strangers = size - neighbours
    if args.transport == "tcp":
        neighbours, strangers = 1, size - 1
    # Every rank sends 1 MiB straight to every other: a pair's bytes travel on its path alone.
    mib = 1 << 20
    sends = [dist.isend(torch.full((mib // 4,), float(rank)), peer) for peer in range(size) if peer != rank]
    got = {peer: torch.zeros(mib // 4) for peer in range(size) if peer != rank}
    for peer, t in got.items():
        dist.recv(t, peer)
        c.true(f"1 MiB from rank {peer}", torch.equal(t, torch.full((mib // 4,), float(peer))))
    for w in sends:
        w.wait()
    dist.barrier()  # every rank has read what it was sent: the byte counts are final
    # Where any rank is on another host, the TCP group connects every pair, so a rank's
    # neighbours have an idle connection (set-up bytes only): the ones that carried a MiB count.
    carried, segments = tcp_connections(store_port), shm_segments()
    busy = [b for b in carried if b[1] >= mib]  # it received its peer's MiB
    idle = [b for b in carried if sum(b) < 64 << 10]
    c.true("data over TCP to each rank on another host, none to this host's", len(busy) == strangers,
           f"({len(busy)} connections received 1 MiB or more of {carried}, {strangers} ranks elsewhere)")
    c.true("other TCP connections idle", len(busy) + len(idle) == len(carried), f"(bytes {carried})")
    want_segments = neighbours if neighbours > 1 else 0
    c.true("a segment mapped per rank of this host", len(segments) == want_segments,
           f"({len(segments)} mapped, {want_segments} ranks here)")
    if strangers == 0:
        c.true("no TCP connection on one host", not carried, f"(bytes {carried})")

    x = torch.full((1000,), float(rank + 1))
    dist.all_reduce(x)
    c.true("the world's allreduce", torch.equal(x, torch.full((1000,), float(size * (size + 1) // 2))))

    sockets_before, segments_before = socket_inodes(), shm_segments()
    everyone = dist.new_group(list(range(size)), backend="dtrain")
    pair = dist.new_group([0, 1], backend="dtrain")
    y = torch.full((4096,), float(rank))
    dist.all_reduce(y, group=everyone)
    c.true("an allreduce on new_group(every rank)", torch.equal(y, torch.full((4096,), float(size * (size - 1) // 2))))
    if rank < 2:
        z = torch.full((3,), float(10 + rank))
        dist.all_reduce(z, group=pair)
        c.true("an allreduce on new_group([0, 1])", torch.equal(z, torch.full((3,), 21.0)))
        got = torch.zeros(5)
        if rank == 0:
            dist.send(torch.arange(5.0), 1, group=pair)
            dist.recv(got, 1, group=pair)
            c.true("a reply on new_group([0, 1])", torch.equal(got, torch.arange(5.0) * 2))
        else:
            dist.recv(got, 0, group=pair)
            dist.send(got * 2, 0, group=pair)
    dist.barrier(group=everyone)
    c.true("new_group opened no socket", socket_inodes() == sockets_before,
           f"({len(socket_inodes() - sockets_before)} new)")
    c.true("new_group mapped no segment", shm_segments() == segments_before)

    gloo = dist.new_group(list(range(size)), backend="gloo")
    c.true("a Gloo group opens sockets (the count sees them)", len(socket_inodes() - sockets_before) > 0)
    return finish(c, dist, gloo, rank)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", default="a,a,a", help="each rank's DTRAIN_HOST_ID, comma-separated (one rank each)")
    p.add_argument("--transport", choices=["tcp", "shm"], help="DTRAIN_TRANSPORT for every rank")
    p.add_argument("--module-dir", help="where dtrain_torch's module was built")
    args = p.parse_args()
    hosts = args.hosts.split(",")
    args.ranks = len(hosts)
    if "RANK" not in os.environ:
        return launch(args)
    return rank_main(args, hosts)


if __name__ == "__main__":
    sys.exit(main())

"""Where the ranks of an MPI communicator meet over TCP: the address of a store on rank 0 (torch.distributed's
TCPStore) that every rank can reach, and the network interface gloo should use to reach the others.

Hosts are told apart by MPI (MPI_COMM_TYPE_SHARED), never by hostname: network namespaces and many
containers report one hostname for different hosts. When every rank is on rank 0's host the store is
on 127.0.0.1. Otherwise rank 0 offers the IPv4 addresses of its interfaces (the one named by
GLOO_SOCKET_IFNAME first, when set), every other rank tries to connect to each, and the first address
that every rank reached is the store's.
"""
from __future__ import annotations

import fcntl
import os
import socket
import struct
from typing import Optional

from mpi4py import MPI

from .errors import HFRError

__all__ = ["store_address", "interface_towards"]

_SIOCGIFADDR = 0x8915  # Linux ioctl: an interface's IPv4 address
_CONNECT_TIMEOUT = 3.0


def ipv4_interfaces() -> dict[str, str]:
    """{interface name: its IPv4 address} of this host's interfaces that have one, loopback included."""
    found = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address, or down
                continue
            found[name] = socket.inet_ntoa(packed[20:24])
    return found


def interface_towards(address: str) -> Optional[str]:
    """The name of this host's interface whose address routes to `address` (None if none does)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((address, 9))  # UDP: picks the route, sends nothing
        except OSError:
            return None
        local = s.getsockname()[0]
    return next((name for name, addr in ipv4_interfaces().items() if addr == local), None)


def _reachable(addresses: list[str], port: int) -> list[bool]:
    reached = []
    for address in addresses:
        try:
            with socket.create_connection((address, port), timeout=_CONNECT_TIMEOUT):
                reached.append(True)
        except OSError:
            reached.append(False)
    return reached


def store_address(comm: MPI.Intracomm) -> tuple[str, int]:
    """(host, port) of a free TCP port on rank 0 that every rank of comm can reach; collective over comm.
    On hosts other than rank 0's it also sets GLOO_SOCKET_IFNAME, unless already set, to the interface
    that reaches the store, so that gloo's sockets take the same network."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        on_rank0_host = comm.allreduce(1 if node.allreduce(comm.rank == 0, op=MPI.LOR) else 0) == comm.size
    finally:
        node.Free()
    probe = None
    offer: Optional[tuple[list[str], int]] = None
    if comm.rank == 0:
        probe = socket.socket()
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("", 0))
        interfaces = ipv4_interfaces()
        preferred = os.environ.get("GLOO_SOCKET_IFNAME", "").split(",")[0]
        names = sorted((n for n in interfaces if not interfaces[n].startswith("127.")), key=lambda n: n != preferred)
        # Never accepted: the backlog must hold every rank's probe of every address, or the kernel drops
        # the later ones (4 hosts x 2 ranks, two addresses: 14 probes, and "unreachable" with size 8).
        probe.listen(comm.size * max(1, len(names)))
        offer = (["127.0.0.1"] if on_rank0_host else [interfaces[n] for n in names], probe.getsockname()[1])
    try:
        addresses, port = comm.bcast(offer, root=0)
        if on_rank0_host:
            return "127.0.0.1", port
        reached = _reachable(addresses, port) if comm.rank != 0 else [True] * len(addresses)
        everyone = [all(column) for column in zip(*comm.allgather(reached))]
    finally:
        if probe is not None:
            probe.close()
    chosen = next((a for a, ok in zip(addresses, everyone) if ok), None)
    if chosen is None:
        raise HFRError(f"no address of rank 0's host ({', '.join(addresses) or 'none but loopback'}) is "
                       f"reachable from every rank over TCP; set GLOO_SOCKET_IFNAME on rank 0 to the "
                       f"interface the hosts share")
    if "GLOO_SOCKET_IFNAME" not in os.environ:
        interface = interface_towards(chosen)
        if interface is not None:
            os.environ["GLOO_SOCKET_IFNAME"] = interface
    return chosen, port

"""Who is where: nodes and rails.

A **node** is a group of ranks that share host memory (one host, or with HFR_LOCAL_SIZE / local_size
a group of that many consecutive ranks, emulating a host). A rank's **local rank** is its index in its
node. A **rail** is the set of ranks with the same local rank, one per node; its rank r is node r.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from mpi4py import MPI

__all__ = ["Layout", "split", "requested_local_size", "host_cache_bytes"]


@dataclass(frozen=True)
class Layout:
    rank: int
    size: int
    local_rank: int
    local_size: int
    node: int
    nnodes: int
    node_ranks: tuple  # global ranks of this node's ranks, by local rank
    rank_nodes: tuple  # the node of every global rank
    rail_ranks: tuple  # global ranks of this rank's rail, by node
    host_size: int  # ranks on this rank's host (more than local_size when nodes are emulated)


def host_cache_bytes(cpus: str = "/sys/devices/system/cpu") -> int:
    """The host's last-level cache: the size of the highest cache level the CPUs report (sysfs), times
    the number of its instances (CPUs that share one list the same CPUs); 0 where sysfs does not say."""
    sizes: dict[str, int] = {}  # one instance of the last level, by the CPUs sharing it
    top = 0
    try:
        for cpu in os.listdir(cpus):
            caches = os.path.join(cpus, cpu, "cache")
            if not (cpu.startswith("cpu") and cpu[3:].isdigit() and os.path.isdir(caches)):
                continue
            for index in os.listdir(caches):
                path = os.path.join(caches, index)
                if not index.startswith("index") or _read(path, "type") == "Instruction":
                    continue
                level, size, shared = int(_read(path, "level")), _read(path, "size"), _read(path, "shared_cpu_list")
                if level > top:
                    top, sizes = level, {}
                if level == top:
                    sizes[shared] = int(size[:-1]) << _SHIFTS[size[-1]] if size[-1] in _SHIFTS else int(size)
    except (OSError, ValueError, KeyError, IndexError):
        return 0
    return sum(sizes.values())


_SHIFTS = {"K": 10, "M": 20, "G": 30}  # sysfs writes cache sizes as 32K, 1024K, 32768K


def _read(path: str, name: str) -> str:
    with open(os.path.join(path, name)) as f:
        return f.read().strip()


def requested_local_size(local_size: Optional[int]) -> Optional[int]:
    """local_size, else HFR_LOCAL_SIZE, else None (take the hosts as MPI sees them)."""
    if local_size is None:
        env = os.environ.get("HFR_LOCAL_SIZE", "").strip()
        if not env:
            return None
        try:
            local_size = int(env)
        except ValueError:
            raise ValueError(f"HFR_LOCAL_SIZE={env!r} is not an integer") from None
    if isinstance(local_size, bool) or not isinstance(local_size, int) or local_size < 1:
        raise ValueError(f"local_size must be a positive integer, got {local_size!r}")
    return local_size


def split(comm: MPI.Comm, local_size: Optional[int] = None) -> tuple[Layout, MPI.Comm, MPI.Comm]:
    """The layout of comm and its node and rail communicators (collective over comm).

    Raises ValueError on every rank when nodes would be of unequal size, or when an emulated node
    spans more than one host (its ranks could not share memory)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    wanted = requested_local_size(local_size)
    host = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    try:
        if wanted is None:
            node_comm = host.Dup()
        else:
            if size % wanted:
                raise ValueError(f"local_size {wanted} does not divide the {size} ranks into equal nodes")
            node_comm = comm.Split(color=rank // wanted, key=rank)
        # An emulated node must lie within one host: check it on every rank, then decide together.
        spans_hosts = _group_not_within(node_comm, host)
        host_size = host.Get_size()
    finally:
        host.Free()
    local_rank, local = node_comm.Get_rank(), node_comm.Get_size()
    # A node is named by the global rank of its local rank 0; nodes are numbered in that order.
    leader = node_comm.bcast(rank, root=0)
    facts = comm.allgather((leader, local, spans_hosts))
    if any(f[2] for f in facts):
        node_comm.Free()
        raise ValueError(f"local_size {wanted} puts ranks of different hosts into one node")
    sizes = sorted({f[1] for f in facts})
    if len(sizes) > 1:
        node_comm.Free()
        raise ValueError(f"nodes of unequal size {sizes}: hfr needs the same number of ranks on every node")
    leaders = sorted({f[0] for f in facts})
    node = leaders.index(leader)
    rail_comm = comm.Split(color=local_rank, key=node)
    rank_nodes = tuple(leaders.index(f[0]) for f in facts)
    layout = Layout(rank, size, local_rank, local, node, len(leaders), tuple(node_comm.allgather(rank)), rank_nodes,
                    tuple(rail_comm.allgather(rank)), host_size)
    return layout, node_comm, rail_comm


def _group_not_within(node_comm: MPI.Comm, host: MPI.Comm) -> bool:
    """True when some rank of node_comm is not in this rank's host communicator."""
    group, host_group = node_comm.Get_group(), host.Get_group()
    try:
        translated = MPI.Group.Translate_ranks(group, list(range(group.Get_size())), host_group)
        return any(r == MPI.UNDEFINED for r in translated)
    finally:
        group.Free()
        host_group.Free()
